"""`python -m dflash2.training.revocab DRAFT --data DIR --size N --out OUT`: the same draft with a
frequency-ranked draft vocabulary, without training.

Contract: the draft's LM head is the target's (borrowed, never stored), so a reduced-vocabulary
draft needs no new weights: it proposes from the `N` target tokens that occur most often as
response tokens of the regenerated data in `--data` (repeatable; held-out records excluded, as
training excludes them), plus the data's stop tokens, and scores only those rows of the head
(`draft.draft_vocab_size`, the `d2t` / `t2d` buffers). Every other weight is copied bit for bit.
`--size 0` gives a reduced-vocabulary draft its full vocabulary back. It prints the share of the
data's response tokens the vocabulary covers (the ceiling it puts on per-token acceptance) and
writes OUT in the dtype the checkpoint stores; an existing non-empty OUT is refused unless
`--force` (which replaces only config.json and model.safetensors). Bad input: one line, exit 2,
before any weights load.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from dflash2.argparsing import OneLineParser, first_paragraph
from dflash2.data.holdout import is_held_out
from dflash2.data.shards import load_manifest, read_records
from dflash2.data.vocab import coverage, frequency_vocabulary
from dflash2.runtime.dtypes import DTYPES
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import refuse_existing_output
from dflash2.model.draft import DFlash2DraftModel, read_config
from dflash2.training.draft_step import with_vocabulary
from dflash2.files.weights import stored_dtype, weight_files


def response_sequences(dirs: list[str]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], set[int]]:
    """(input_ids, loss_mask) of every record not held out, and the data's stop token ids."""
    sequences, stops = [], set()
    for directory in dirs:
        stops |= set(load_manifest(directory).get("sampling", {}).get("stop_token_ids", []))
        for record in read_records(directory):
            if not is_held_out(record.id):
                sequences.append((torch.as_tensor(record.tokens, dtype=torch.long),
                                  torch.as_tensor(record.loss_mask(), dtype=torch.bool)))
    return sequences, stops


def revocabulary(draft: DFlash2DraftModel, sequences, size: int | None, stops=()) -> tuple[DFlash2DraftModel, float]:
    """-> (the draft with a `size`-token frequency vocabulary (None: the full one), its coverage)."""
    other = with_vocabulary(draft, size).eval()
    if size is None:
        return other, 1.0
    ids = frequency_vocabulary(sequences, size, draft.config.vocab_size, stops)
    other.set_draft_vocabulary(ids)
    return other, coverage(sequences, ids, draft.config.vocab_size)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m dflash2.training.revocab", description=first_paragraph(__doc__))
    p.add_argument("draft", help="draft checkpoint directory")
    p.add_argument("--data", action="append", required=True, help="regenerated data directory (repeat for several)")
    p.add_argument("--size", type=int, required=True, help="draft vocabulary size (0: the target's whole vocabulary)")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--force", action="store_true", help="replace config.json and model.safetensors in a non-empty --out")
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        source = Path(args.draft)
        require((source / "config.json").is_file(), f"draft checkpoint '{source}' has no config.json")
        config = read_config(source)
        weight_files(source)
        require(0 <= args.size <= config.vocab_size, f"--size must be in [0, {config.vocab_size}], got {args.size}")
        require(Path(args.out).resolve() != source.resolve(), "--out is the draft itself; choose another directory")
        refuse_existing_output(args.out, args.force, "--out", "--force", "config.json and model.safetensors")
        for directory in args.data:
            load_manifest(directory)
        dtype = DTYPES[stored_dtype(source)]
        sequences, stops = response_sequences(args.data)
        require(bool(sequences) or args.size == 0, "--data holds no training records")
        draft = DFlash2DraftModel.from_pretrained(source, dtype=torch.float32)
        other, share = revocabulary(draft, sequences, args.size or None, stops)
        other.to(dtype).save_pretrained(args.out)
    except DFlash2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    what = f"{args.size} tokens" if args.size else "the full vocabulary"
    print(f"wrote {args.out}: {what}, covering {100 * share:.1f} % of {sum(int(m.sum()) for _, m in sequences):,} "
          f"response tokens of {len(sequences):,} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
