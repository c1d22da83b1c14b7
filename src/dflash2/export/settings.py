"""Typed settings and results of `dflash2 export`.

Contract:
- `ExportSettings` is everything one export needs; `validate()` checks every field that can be
  checked without loading weights or a target (one-line `DFlash2Error`s), so bad input fails
  before anything slow starts.
- `ExportResult` says what was written and what changed on the way: parts completed in their
  neutral form, parts dropped, and (for `dflash-v1`) the measured `AcceptanceCost`.
- `AcceptanceCost` holds the acceptance length of the original draft and of the exported v1
  draft on the same prompts, same target, greedy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflash2.errors import require
from dflash2.files.atomic import refuse_existing_output, require_creatable

FORMS = ("dflash2", "dflash-v1", "gguf")
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: the dtype the checkpoint stores
GGUF_FILE = "draft.gguf"


@dataclass(frozen=True)
class ExportSettings:
    draft: Path                    # source checkpoint directory (config.json + *.safetensors)
    form: str                      # one of FORMS
    out: Path                      # directory to create
    force: bool = False            # write into a non-empty `out`, replacing only the export's own files
    target: str = "smollm2"        # the draft's target: acceptance cost (dflash-v1, a reduced vocabulary), tokenizer (gguf)
    dtype: str = "auto"            # weights in the export (GGUF: its matrices; vectors stay F32)
    measure_prompts: int = 4       # dflash-v1: prompts for the acceptance measurement (0: skip)
    measure_tokens: int = 64       # dflash-v1: new tokens per prompt

    def validate(self) -> None:
        require(self.form in FORMS, f"--to '{self.form}': choose one of {', '.join(FORMS)}")
        require(self.dtype in DTYPES, f"--dtype '{self.dtype}': choose one of {', '.join(DTYPES)}")
        require(self.draft.is_dir(), f"draft '{self.draft}' is not a directory with config.json and weights")
        require((self.draft / "config.json").is_file(), f"draft checkpoint '{self.draft}' has no config.json")
        require(isinstance(self.measure_prompts, int) and self.measure_prompts >= 0,
                f"--measure-prompts must be an integer >= 0, got {self.measure_prompts!r}")
        require(isinstance(self.measure_tokens, int) and self.measure_tokens > 0,
                f"--measure-tokens must be a positive integer, got {self.measure_tokens!r}")
        require_creatable(self.out, "--out")   # before resolving it: a symbolic link loop cannot be resolved
        out, draft = self.out.resolve(), self.draft.resolve()
        require(out != draft and out not in draft.parents,
                f"--out '{self.out}' holds the draft being exported; choose another directory")
        refuse_existing_output(self.out, self.force, "--out", "--force", "the export's own files")


@dataclass(frozen=True)
class AcceptanceCost:
    prompts: int
    new_tokens_per_prompt: int
    original_acceptance_length: float
    exported_acceptance_length: float
    identical_outputs: bool        # greedy: both must equal the target's own output

    @property
    def loss(self) -> float:
        return self.original_acceptance_length - self.exported_acceptance_length

    def line(self) -> str:
        pct = 100 * self.loss / self.original_acceptance_length if self.original_acceptance_length else 0.0
        return (f"acceptance length {self.original_acceptance_length:.2f} -> {self.exported_acceptance_length:.2f} "
                f"({-self.loss:+.2f}, {-pct:+.1f} %) on {self.prompts} prompts x {self.new_tokens_per_prompt} tokens, "
                f"greedy; outputs identical: {self.identical_outputs}")


@dataclass
class ExportResult:
    form: str
    out: Path
    files: list[Path]
    architecture: str
    tensors: int
    dtype: str                                          # what "auto" resolved to
    completed: list[str] = field(default_factory=list)  # parts added in their neutral form
    dropped: list[str] = field(default_factory=list)    # parts removed
    cost: AcceptanceCost | None = None
    notes: list[str] = field(default_factory=list)
