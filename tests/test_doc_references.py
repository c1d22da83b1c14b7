"""The documents hold together: every numbered section that the documents, the source, the tests, the
scripts and the configs cite (`BENCHMARKS.md §2.2`, `BENCHMARKS.md sections 1 and 7.1`, `TRAINING.md §4`,
`docs/spec.md §3`, a bare `§N` inside BENCHMARKS.md or TRAINING.md meaning their own) is a heading
of that document; every `TRAINING.md, "GPU path"`-style citation names a heading there; every relative link in a
document points at a file of the repository; and no user document narrates the project's working
history ("this session", "today"). docs/history/ is the record: it keeps the old section numbers and
the old wording on purpose, so only its links are checked."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HISTORY = ROOT / "docs" / "history"
NUMBERED = {"BENCHMARKS": "BENCHMARKS.md", "TRAINING": "TRAINING.md", "SPEC": "docs/spec.md"}
# a document's name, then one or more section numbers joined by ", ", " and ", "-" ...
CITATION = re.compile(r"(BENCHMARKS|TRAINING|SPEC|spec)(?:\.md)?,? *(?:§ ?|sections? )(\d+(?:\.\d+)?"
                      r"(?:(?:, | and | or |-|–)(?:§ ?)?\d+(?:\.\d+)?)*)")
BARE = re.compile(r"(?<![\w.])(?<!old )§ ?(\d+(?:\.\d+)?(?:(?:, | and | or |-|–)(?:§ ?)?\d+(?:\.\d+)?)*)")
NAMED = re.compile(r'TRAINING\.md,? "([^"]+)"')
LINK = re.compile(r"\]\(([^)\s]+)\)")
NARRATION = re.compile(r"\b(?:this|next|previous|last) session\b|\btoday\b|\bthis stretch\b|\bwe (?:then )?tried\b",
                       re.IGNORECASE)


def _sections(document: str) -> set[str]:
    """'2', '2.2', ... of the numbered headings (`## 2. Title`, `### 2.2 Title`) of a document."""
    text = (ROOT / document).read_text()
    return {m.group(1) for m in re.finditer(r"^#{2,4} (\d+(?:\.\d+)?)\.? ", text, re.MULTILINE)}


def _numbers(joined: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", joined)


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "TRAINING.md"]
    files += [p for p in (ROOT / "docs").rglob("*.md") if HISTORY not in p.parents]
    for folder, pattern in (("src", "*.py"), ("tests", "*.py"), ("scripts", "*"), ("configs", "*.yaml")):
        files += [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and p.suffix in (".py", ".sh", ".yaml", "")]
    return sorted(set(files))


def _user_documents() -> list[Path]:
    docs = [p for p in (ROOT / "docs").glob("*.md") if p.name != "spec.md"]
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "TRAINING.md", *sorted(docs)]


def test_every_cited_section_is_a_heading_of_its_document():
    sections = {name: _sections(path) for name, path in NUMBERED.items()}
    assert sections["BENCHMARKS"] and sections["TRAINING"] and sections["SPEC"]
    broken = []
    for path in _sources():
        text = path.read_text(errors="replace")
        cited = [(m.group(1).upper(), n) for m in CITATION.finditer(text) for n in _numbers(m.group(2))]
        own = {"BENCHMARKS.md": "BENCHMARKS", "TRAINING.md": "TRAINING"}.get(path.name)
        if own and path.parent == ROOT:
            spans = [range(m.start(), m.end()) for m in CITATION.finditer(text)]
            cited += [(own, n) for m in BARE.finditer(text) if not any(m.start() in s for s in spans)
                      for n in _numbers(m.group(1))]
        broken += [f"{path.relative_to(ROOT)}: {name} §{number}" for name, number in cited
                   if number not in sections[name]]
    assert not broken, "sections cited but not found:\n" + "\n".join(broken)


def test_every_named_training_section_exists():
    headings = [line for line in (ROOT / "TRAINING.md").read_text().splitlines() if line.startswith("#")]
    broken = [f"{path.relative_to(ROOT)}: {name!r}" for path in _sources()
              for name in NAMED.findall(path.read_text(errors="replace"))
              if not any(name in heading for heading in headings)]
    assert not broken, "TRAINING.md headings cited but not found:\n" + "\n".join(broken)


def test_every_relative_link_in_the_documents_resolves():
    documents = _user_documents() + sorted(HISTORY.glob("*.md")) + [ROOT / "docs" / "spec.md"]
    broken = []
    for path in documents:
        for target in LINK.findall(path.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", _user_documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_documents_state_the_current_state(path):
    lines = [f"{n}: {line}" for n, line in enumerate(path.read_text().splitlines(), 1) if NARRATION.search(line)]
    assert not lines, f"{path.relative_to(ROOT)} narrates the project's working history:\n" + "\n".join(lines)
