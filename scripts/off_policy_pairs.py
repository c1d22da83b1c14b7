"""The ShareGPT answers behind a regenerated directory's prompts: a chat file for its off-policy twin.

Usage: PYTHONPATH=src python scripts/off_policy_pairs.py --regen data/regen/smollm2-sharegpt \
           --out runs/off-policy/sharegpt.jsonl [--check-against DIR]

For each record of `--regen` (ids `sharegpt:ID`, in the directory's order), ShareGPT conversation
ID's first user turn and the reply that follows it, as one ShareGPT record a line (`id` = ID),
except the records of the held-out split (`data.holdout`: the yardstick decodes their prompts; an
off-policy record's id, `NAME:ID:TURN`, would fall elsewhere in the split). Then
`dflash2 regenerate --target T --prompts OUT --off-policy --out DIR` makes training data on the same
prompts with the answers ShareGPT holds (written by another model), the pair TRAINING.md §2 measures
off-policy data with. Conversations whose first user turn has no reply are left out (counted).
`--check-against DIR` (that off-policy directory, once made) checks, record by record, that its
prompt token ids equal the regenerated directory's: the same prompts, to the token.
The file holds ShareGPT text: keep it out of the repository (runs/ is ignored).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dflash2.data.chat_files import parse_record
from dflash2.data.holdout import is_held_out
from dflash2.data.prompts import iter_sharegpt_records
from dflash2.data.shards import read_records
from dflash2.errors import DFlash2Error
from dflash2.files.atomic import atomic_write

def first_exchange(record) -> tuple[str, str] | None:
    """(the first user turn with text, the assistant reply right after it), or None: no such reply, or
    a record `data.chat_files` would not read (its reading of ShareGPT's roles)."""
    try:
        messages = parse_record(record, "", "0").messages
    except DFlash2Error:
        return None
    first = next(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].strip())
    reply = messages[first + 1] if first + 1 < len(messages) else None
    if reply is None or reply["role"] != "assistant" or not reply["content"].strip():
        return None
    return messages[first]["content"], reply["content"]


def write_pairs(regen: Path, out: Path) -> tuple[int, int]:
    wanted = [r.id.split(":", 1)[1] for r in read_records(regen)
              if r.id.startswith("sharegpt:") and not is_held_out(r.id)]
    found: dict[str, tuple[str, str]] = {}
    targets = set(wanted)
    for index, record in enumerate(iter_sharegpt_records()):
        key = str(record.get("id", index)) if isinstance(record, dict) else str(index)
        if key in targets and key not in found:
            pair = first_exchange(record)
            if pair is not None:
                found[key] = pair
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out, "w") as handle:
        for key in wanted:
            if key in found:
                user, reply = found[key]
                handle.write(json.dumps({"id": key, "conversations": [{"from": "human", "value": user},
                                                                      {"from": "gpt", "value": reply}]}) + "\n")
    return len(found), len(wanted) - len(found)   # (written, without a reply)


def check(regen: Path, off_policy: Path) -> tuple[int, int]:
    """(records whose prompt ids match, records that differ), by ShareGPT id."""
    prompts = {r.id.split(":", 1)[1]: r.prompt.tolist() for r in read_records(regen)}
    same = differ = 0
    for record in read_records(off_policy):     # ids NAME:ID:TURN (`training.prompt_sets`)
        key = record.id.split(":")[1]
        if prompts.get(key) == record.prompt.tolist():
            same += 1
        else:
            differ += 1
    return same, differ


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--regen", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--check-against", default=None)
    args = parser.parse_args()
    if args.check_against:
        same, differ = check(Path(args.regen), Path(args.check_against))
        print(f"{same} records with the regenerated prompt's ids, {differ} without")
        return 0 if differ == 0 else 1
    kept, dropped = write_pairs(Path(args.regen), Path(args.out))
    print(f"wrote {kept} first exchanges to {args.out} ({dropped} prompts without a reply left out)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
