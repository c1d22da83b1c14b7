"""Regeneration on the device for the GPU path: prompts travel as token ids, the target answers them
there with the project's engine at large batch, and the answers come back as shards.

Contract:
- Here, before the device calls: `python -m dflash2.tools.gpu.regen prompts [--target smollm2]
  [--source NAME=N ...] [--out .gpu/prompts] [--skip DIR ...]` encodes the first N training prompts
  of each source (`training.regenerate.encode_training_prompts`: the target's chat template, the
  same seeded order and length cap as `dflash2 regenerate`) and drops every id already stored in
  the `--skip` directories (default: every `data/regen/*`), so the device answers only new
  prompts. `save_prompts` writes `prompts.npz` (ids, flat int32 tokens, offsets; compressed) and
  `prompts.json` (sources, counts, selection, the arrays' sha256); `load_prompts` reads and checks
  them (a damaged or missing file is a one-line `DFlash2Error`).
- On the device: `regenerate_phase(model, tokenizer, name, prompts_dir, out_dir, deadline,
  batch_size, max_new_tokens)` answers the prompts greedily with `training.regenerate.generate_shards`
  (one engine session, continuous batching, `batch_size` rows) into `out_dir`, starting no prompt
  after `deadline` (epoch seconds), resumable across calls like `dflash2 regenerate`. The manifest
  records the target as it ran there (dtype included: a bf16 target's greedy answers may differ
  from an fp32 one's; the data is on-policy for the target either way). `tokenizer=None` (tiny
  test targets) records no tokenizer and stops at `stop_ids`. Returns the generate summary plus
  answers per second.
- `pack_data(data_dir, out_dir, part_bytes)` packs the shard directory (manifest and compressed
  token-id shards) as `data.tar` parts with their manifest in `out_dir` (`parts.pack_directory`);
  `collect_data(parts_dir, dest)` (`python -m dflash2.tools.gpu.regen collect FILES_AT/data DEST`)
  rebuilds it here, every shard checked, as a directory the CPU campaign trains on.
"""
from __future__ import annotations

import hashlib
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np

from dflash2.argparsing import OneLineParser, first_paragraph, run_command
from dflash2.errors import require
from dflash2.tools.gpu import parts as gpu_parts
from dflash2.training.data_identity import sampling_fields, target_fields, tokenizer_fields
from dflash2.training.regenerate import Prompt, encode_training_prompts, generate_shards

PROMPTS_ARRAYS, PROMPTS_RECORD = "prompts.npz", "prompts.json"


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def save_prompts(prompts: list[Prompt], out_dir: str | Path, selection: dict) -> dict:
    """Write the prompts as token ids (see the module docstring); returns the record written."""
    require(bool(prompts), "no prompts to save")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(p.tokens) for p in prompts], dtype=np.int64)
    arrays = {"ids": np.array([p.id for p in prompts], dtype=np.str_),
              "tokens": np.concatenate([np.asarray(p.tokens, dtype=np.int32) for p in prompts]),
              "offsets": np.concatenate([[0], np.cumsum(lengths)])}
    np.savez_compressed(out_dir / PROMPTS_ARRAYS, **arrays)
    record = {"prompts": len(prompts), "tokens": int(lengths.sum()), "sha256": _digest(arrays), **selection}
    (out_dir / PROMPTS_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def load_prompts(prompts_dir: str | Path) -> tuple[list[Prompt], dict]:
    """(prompts, record) from `save_prompts`' files, checked against the record's sha256."""
    prompts_dir = Path(prompts_dir)
    require((prompts_dir / PROMPTS_RECORD).is_file() and (prompts_dir / PROMPTS_ARRAYS).is_file(),
            f"no prompts in '{prompts_dir}' (make them with: python -m dflash2.tools.gpu.regen prompts)")
    record = json.loads((prompts_dir / PROMPTS_RECORD).read_text())
    with np.load(prompts_dir / PROMPTS_ARRAYS, allow_pickle=False) as data:
        arrays = {name: data[name] for name in ("ids", "tokens", "offsets")}
    require(_digest(arrays) == record.get("sha256"), f"'{prompts_dir / PROMPTS_ARRAYS}' does not match its record "
                                                     f"(sha256): send it again")
    tokens, offsets = arrays["tokens"], arrays["offsets"]
    prompts = [Prompt(str(i), tokens[offsets[k]:offsets[k + 1]].tolist()) for k, i in enumerate(arrays["ids"])]
    return prompts, record


def regenerate_phase(model, tokenizer, name: str, prompts_dir: str | Path, out_dir: str | Path, deadline: float,
                     batch_size: int = 256, max_new_tokens: int = 256, stop_ids=None, progress: bool = False) -> dict:
    """Answer the shipped prompts on this machine into `out_dir` (see the module docstring)."""
    from dflash2.targets.chat import stop_token_ids

    prompts, record = load_prompts(prompts_dir)
    if stop_ids is None:
        stop_ids = stop_token_ids(tokenizer, model.config)
    template = getattr(tokenizer, "chat_template", None)
    fields = {"target": target_fields(name, model),
              "tokenizer": tokenizer_fields(tokenizer) if tokenizer is not None else None,
              "prompts": {k: record[k] for k in ("sources", "seed", "max_prompt_tokens", "selection")},
              "sampling": sampling_fields(max_new_tokens, 0.0, 1.0, 0, stop_ids, template)}
    summary = generate_shards(model, prompts, out_dir, fields, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                              batch_size=batch_size, run={"where": "device", "prompts_sha256": record["sha256"]},
                              progress=progress, deadline=deadline)
    seconds = max(summary["seconds"], 1e-9)
    return {**summary, "answers_per_second": round(summary["records_added"] / seconds, 2)}


def pack_data(data_dir: str | Path, out_dir: str | Path, part_bytes: int) -> dict:
    """The shard directory as `data.tar` parts + manifest in `out_dir`."""
    return gpu_parts.pack_directory(data_dir, out_dir, part_bytes, name="data.tar")


def _stored_ids(dirs: list[Path]) -> set[str]:
    from dflash2.data.shards import done_ids

    ids: set[str] = set()
    for directory in dirs:
        ids |= done_ids(directory)
    return ids


def _export(args) -> int:
    from dflash2.targets.builtin import open_target

    sources = {}
    for item in args.source or ["sharegpt=4000"]:
        source, _, count = item.partition("=")
        require(count.isdigit() and int(count) > 0, f"--source must be NAME=N (N > 0), got {item!r}")
        sources[source] = int(count)
    skip = [Path(d) for d in args.skip] if args.skip else sorted(p.parent for p in Path("data/regen").glob("*/manifest.json"))
    tokenizer = open_target(args.target).tokenizer
    stored, prompts = _stored_ids(skip), []
    for source, count in sources.items():
        encoded = encode_training_prompts(tokenizer, count, args.seed, source, args.max_prompt_tokens)
        prompts += [p for p in encoded if p.id not in stored]
    selection = {"sources": sources, "seed": args.seed, "max_prompt_tokens": args.max_prompt_tokens,
                 "selection": "per source, the first N of training_prompts(seed) order encoding to <= max_prompt_tokens "
                              f"tokens, minus the ids stored in {', '.join(map(str, skip)) or 'nothing'}"}
    record = save_prompts(prompts, args.out, selection)
    print(json.dumps({k: record[k] for k in ("prompts", "tokens", "sources")}))
    return 0


def collect_data(parts_dir: str | Path, dest: str | Path) -> dict:
    """Rebuild the shard directory a device call gave back (`parts_dir`: its `data/` folder) into
    `dest` (which must not exist yet, or be empty), and read every record (each shard's sha256 is
    checked); returns the manifest's counts."""
    from dflash2.data.shards import load_manifest, read_records
    from dflash2.files.atomic import refuse_existing_output

    dest = Path(dest)
    refuse_existing_output(dest, False, "DEST", "--force", "regenerated shards")
    gpu_parts.unpack_parts(parts_dir, dest)
    records = sum(1 for _ in read_records(dest))
    counts = load_manifest(dest)["counts"]
    require(records == counts["records"], f"'{dest}' holds {records} records, its manifest says {counts['records']}")
    return counts


def _main(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="python -m dflash2.tools.gpu.regen", description=first_paragraph(__doc__))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    p = sub.add_parser("prompts", help="encode training prompts as token ids for the device")
    p.add_argument("--target", default="smollm2")
    p.add_argument("--source", action="append", help="NAME=N, repeatable (default sharegpt=4000)")
    p.add_argument("--out", default=".gpu/prompts")
    p.add_argument("--skip", action="append", help="a shard directory whose ids are left out (default: data/regen/*)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    c = sub.add_parser("collect", help="rebuild the regenerated shards a device call gave back")
    c.add_argument("parts_dir", help="the reply's data/ folder (data.tar.part-NN, manifest.json)")
    c.add_argument("dest", help="new shard directory, e.g. data/regen/smollm2-device")
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(json.dumps(collect_data(args.parts_dir, args.dest)))
        return 0
    return _export(args)


main = partial(run_command, _main)   # a bad input is one line `error: ...` and 2 (`argparsing.run_command`)


if __name__ == "__main__":
    sys.exit(main())
