"""Regenerate training responses with the target itself (docs/spec.md §4: the draft imitates the target).

It runs the target (and optionally a draft) through the decoding engine, so it lives with training,
not in `data/` (which only reads, writes and selects data).

Contract:
- `regenerate(target, out_dir, num_prompts, ...)` loads the target, takes the training prompts of
  `prompts_source` in the fixed shuffled order of `training_prompts(seed=seed)`, encodes each one's
  first user turn with the target's chat template, keeps the first `num_prompts` whose encoding has
  at most `max_prompt_tokens` tokens, generates the responses with the engine (autoregressive, or
  speculative with `draft`, which is lossless) and stores them as token-id shards (`shards.py`).
  Returns a summary dict (records added and stored, response tokens and tokens/s of this run).
  Every setting, the output directory (`shards.check_output_dir`) and the draft (its weights, and
  that it was made for this target) are checked before the target's weights load.
- `generate_shards(model, prompts, out_dir, manifest_fields, ...)` is the tokenizer-free core:
  `prompts` are `Prompt(id, tokens)`. Pending prompts, shortest first, are decoded by one engine
  session with continuous batching: up to `batch_size` rows at once, a finished row's record
  stored at once and its place taken by the next prompt at the next cycle boundary (in-place KV,
  ragged rows; no fixed batch waiting for its longest answer). Each response keeps its stop token;
  a sampled row's seed depends only on the run's seed and the prompt id.
- Resumable: rerunning the same command (any `num_prompts`) skips ids already stored, so nothing is
  duplicated; settings that change the data (target, tokenizer, prompt selection, sampling) must
  equal the existing manifest's, else a one-line `DFlash2Error`. Interrupting (Ctrl-C or SIGTERM)
  saves every finished record before exiting. The draft, batch size and shard size may change
  between runs (the draft is lossless); they are recorded per run in the manifest's `runs`.
- `device` / `dtype` (`--device`, `--dtype`, default `auto`: `devices.resolve_precision`, or,
  continuing a directory, the precision its records were made in) are checked before anything
  loads and recorded: the target's dtype in the manifest's `target` (a field that must match on
  every run), the device, the precision's reason and `--exact-verify` in each run's entry.
- `main(argv)` is the command line (`dflash2 regenerate` calls it): returns 0, 2 on a user error
  (one line on stderr) or 130 when interrupted.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dflash2.argparsing import OneLineParser, add_device_arguments
from dflash2.targets.chat import encode_prompt, stop_token_ids
from dflash2.decoding.context import check_context, effective_block_size
from dflash2.decoding.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier import context_limit
from dflash2.model.shape import target_text_config
from dflash2.errors import DFlash2Error, require
from dflash2.data.shards import Record, ShardWriter
from dflash2.decoding.verifier import TargetAdapter


@dataclass
class Prompt:
    id: str
    tokens: list[int]


def _say(message: str) -> None:
    tqdm.write(f"dflash2 regenerate: {message}", file=sys.stderr)


def check_fits_context(prompts: list[Prompt], files, draft, max_new_tokens: int) -> None:
    """The engine's context rule for the longest prompt, before the target's weights load."""
    block = effective_block_size(None if draft is None else draft.config.block_size, None)
    longest = max(len(p.tokens) for p in prompts) if prompts else 1
    try:
        check_context(longest, max_new_tokens, block, context_limit(target_text_config(files.config)))
    except DFlash2Error as err:
        raise DFlash2Error(f"--max-new-tokens {max_new_tokens}: the longest prompt does not fit ({err})") from None


# --------------------------------------------------------------------------- manifest fields

def _sha256_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def config_sha256(config) -> str:
    """The hash of a target's Hugging Face config, without what varies between loads of one model."""
    config = config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        config.pop(volatile, None)
    return _sha256_json(config)


def target_fields(name: str, model) -> dict:
    """What identifies the target: its name, architecture, config hash and a weights fingerprint."""
    weights = hashlib.sha256()
    with torch.no_grad():
        for param_name, param in sorted(model.state_dict().items()):
            weights.update(param_name.encode())
            weights.update(param.detach().reshape(-1)[:256].float().cpu().numpy().tobytes())
    return {"name": name, "model_type": model.config.model_type, "vocab_size": model.config.vocab_size,
            "num_hidden_layers": getattr(model.config, "num_hidden_layers", None),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "config_sha256": config_sha256(model.config), "weights_fingerprint": weights.hexdigest()[:16]}


def tokenizer_fields(tokenizer) -> dict:
    vocab = tokenizer.get_vocab()
    return {"class": type(tokenizer).__name__, "vocab_size": len(vocab),
            "vocab_sha256": _sha256_json(sorted(vocab.items(), key=lambda item: item[1])),
            "chat_template": getattr(tokenizer, "chat_template", None)}


def sampling_fields(max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                    stop_ids, chat_template: str | None) -> dict:
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
            "max_new_tokens": int(max_new_tokens), "stop_token_ids": sorted(int(i) for i in stop_ids),
            "chat_template": "target's own, first user turn, generation prompt added" if chat_template
            else "none (plain text)",
            "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None}


# --------------------------------------------------------------------------- prompts

def encode_training_prompts(tokenizer, num_prompts: int, seed: int = 0, source: str = "sharegpt",
                            max_prompt_tokens: int = 512) -> list[Prompt]:
    """The first `num_prompts` training prompts (seeded order) whose encoding fits; ids are
    "<dataset>:<id>"."""
    from dflash2.data.prompts import training_prompts

    prompts: list[Prompt] = []
    for conversation in training_prompts(seed=seed, sources=(source,)):
        tokens = encode_prompt(tokenizer, conversation.prompt)
        if len(tokens) <= max_prompt_tokens:
            prompts.append(Prompt(f"{conversation.dataset}:{conversation.id}", tokens))
            if len(prompts) == num_prompts:
                break
    if len(prompts) < num_prompts:
        _say(f"only {len(prompts)} prompts of {source} fit in {max_prompt_tokens} tokens; using them all")
    return prompts


# --------------------------------------------------------------------------- generation

def _queue(prompts: list[Prompt]) -> deque[Prompt]:
    """Shortest prompts first (ties by id): rows decoding side by side have similar widths."""
    return deque(sorted(prompts, key=lambda p: (len(p.tokens), p.id)))


def _decode_into(decoder: SpeculativeDecoder, writer: ShardWriter, pending: list[Prompt], progress: bool,
                 batch_size: int, stop_ids, seed: int, deadline: float | None = None, **sampling) -> int:
    """Decode the pending prompts with continuous batching into the writer; returns the response
    tokens made. At most `batch_size` rows decode at once in one engine session; a finished row's
    record is stored at once and the next prompt takes its place at the next cycle boundary, so no
    row waits for the longest answer of a fixed batch. A row's seed depends only on `seed` and its
    prompt id. From `deadline` (epoch seconds) on no prompt is admitted; the live rows finish."""
    queue, live = _queue(pending), {}
    session = decoder.session()
    new_tokens, decoded, started = 0, 0, time.perf_counter()
    with tqdm(total=len(pending), unit="rec", desc="regenerate", file=sys.stderr, dynamic_ncols=True,
              mininterval=1.0 if sys.stderr.isatty() else 60.0, disable=not progress) as bar:
        while queue or session:
            if deadline is not None and time.time() >= deadline:
                queue.clear()
            while queue and len(live) < batch_size:
                prompt = queue.popleft()
                config = GenerationConfig(**sampling, stop_token_ids=tuple(stop_ids),
                                          seed=zlib.crc32(f"{seed}:{prompt.id}".encode()))
                live[session.add([prompt.tokens], config)[0]] = prompt
            shards_before = len(writer.manifest["shards"])
            for event in session.step():
                if event.result is None:
                    continue
                prompt = live.pop(event.key)
                writer.add(Record(prompt.id, prompt.tokens, event.result.tokens, event.result.finish_reason))
                new_tokens += len(event.result.tokens)
                decoded += 1
                bar.update(1)
            elapsed = time.perf_counter() - started
            bar.set_postfix_str(f"{new_tokens / max(elapsed, 1e-9):.0f} tok/s", refresh=False)
            for shard in writer.manifest["shards"][shards_before:]:
                eta = (len(pending) - decoded) * elapsed / decoded
                _say(f"wrote {shard['file']} ({shard['records']} records, {writer.manifest['counts']['records']} "
                     f"stored): {new_tokens / elapsed:.1f} tok/s, {decoded * 3600 / elapsed:.0f} records/h, "
                     f"{len(pending) - decoded} to go, ETA {eta / 3600:.2f} h")
    return new_tokens


def generate_shards(model, prompts: list[Prompt], out_dir: str | Path, manifest_fields: dict, *,
                    max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                    stop_ids=(), batch_size: int = 16, seed: int = 0, draft=None, shard_size: int = 256,
                    run: dict | None = None, progress: bool = True, draft_label: str | None = None,
                    deadline: float | None = None, exact_verify: bool = False) -> dict:
    """Generate the responses of the prompts not yet stored in `out_dir` and store them (no new
    prompt starts after `deadline`, epoch seconds: what is left waits for the next run)."""
    check_settings(batch_size, max_new_tokens, temperature, top_p, top_k)
    ids = [p.id for p in prompts]
    require(len(set(ids)) == len(ids), "prompt ids must be unique")
    if draft_label is None and draft is not None:
        draft_label = str(draft) if isinstance(draft, (str, Path)) else type(draft).__name__
    if isinstance(draft, (str, Path)):
        from dflash2.model.draft import DFlash2DraftModel

        draft = DFlash2DraftModel.from_pretrained(str(draft)).to(next(model.parameters()).device).eval()
    run = {**(run or {}), "batch_size": batch_size, "shard_size": shard_size, "draft": draft_label}
    adapter = TargetAdapter(model, None if draft is None else draft.config.target_layer_ids, exact_verify=exact_verify)
    try:
        decoder = SpeculativeDecoder(adapter, draft)
        with ShardWriter(out_dir, manifest_fields, shard_size=shard_size, run=run) as writer:
            pending = [p for p in prompts if p.id not in writer.ids]
            stored_before = writer.manifest["counts"]["records"]
            _say(f"{len(prompts)} prompts: {len(prompts) - len(pending)} already stored, {len(pending)} to "
                 f"generate into {out_dir}")
            started = time.perf_counter()
            new_tokens = _decode_into(decoder, writer, pending, progress, batch_size, stop_ids, seed,
                                      deadline=deadline, max_new_tokens=max_new_tokens, temperature=temperature,
                                      top_p=top_p, top_k=top_k)
    finally:
        adapter.close()
    elapsed = time.perf_counter() - started
    counts = writer.manifest["counts"]
    summary = {"records_added": counts["records"] - stored_before, "records_stored": counts["records"],
               "response_tokens_added": new_tokens, "seconds": round(elapsed, 1),
               "tokens_per_second": round(new_tokens / elapsed, 1) if elapsed else 0.0,
               "shards": len(writer.manifest["shards"]),
               "prompts_left": sum(p.id not in writer.ids for p in prompts)}
    _say(f"done: {json.dumps(summary)}")
    return summary


def check_settings(batch_size: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    require(isinstance(batch_size, int) and batch_size > 0, f"batch_size must be a positive integer, got {batch_size!r}")
    GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k).validate()


def regenerate(target: str, out_dir: str | Path, num_prompts: int, max_new_tokens: int = 256,
               temperature: float = 0.0, batch_size: int = 16, seed: int = 0, draft=None, shard_size: int = 256,
               prompts_source: str = "sharegpt", max_prompt_tokens: int = 512, top_p: float = 1.0,
               top_k: int = 0, progress: bool = True, device: str = "cpu", dtype: str = "auto",
               exact_verify: bool = False) -> dict:
    """Regenerate the responses of `num_prompts` training prompts with `target` into `out_dir`.
    Every setting, the output directory and the draft are checked before the target loads."""
    from dflash2.devices import settle
    from dflash2.data.shards import check_output_dir
    from dflash2.model.draft import DFlash2DraftModel
    from dflash2.pipeline import check_draft_fits
    from dflash2.targets.builtin import load_target_model, open_target

    require(isinstance(num_prompts, int) and num_prompts > 0, f"num_prompts must be a positive integer, got {num_prompts!r}")
    require(isinstance(max_prompt_tokens, int) and max_prompt_tokens > 0,
            f"max_prompt_tokens must be a positive integer, got {max_prompt_tokens!r}")
    require(isinstance(shard_size, int) and shard_size > 0, f"shard_size must be a positive integer, got {shard_size!r}")
    check_settings(batch_size, max_new_tokens, temperature, top_p, top_k)
    check_output_dir(out_dir)
    device, precision = settle(device, stored_dtype(out_dir) if dtype == "auto" else dtype)
    _say(f"target {target} on {device}, {precision.describe()}")
    draft_label = None if draft is None else str(draft)
    if isinstance(draft, (str, Path)):
        draft = DFlash2DraftModel.from_pretrained(draft)
    files = open_target(target)
    if draft is not None:
        check_draft_fits(draft.config, files, draft_label)
    tokenizer = files.tokenizer
    prompts = encode_training_prompts(tokenizer, num_prompts, seed, prompts_source, max_prompt_tokens)
    check_fits_context(prompts, files, draft, max_new_tokens)
    if exact_verify:
        from dflash2.decoding.exact_verify import check_plan

        check_plan(target_text_config(files.config), device, precision.torch_dtype)
    model = load_target_model(files, device, precision.torch_dtype)
    if draft is not None:
        draft = draft.to(device)
    stop_ids = stop_token_ids(tokenizer, model.config)
    template = getattr(tokenizer, "chat_template", None)
    fields = {
        "target": target_fields(target, model),
        "tokenizer": tokenizer_fields(tokenizer),
        "prompts": {"source": prompts_source, "seed": seed, "max_prompt_tokens": max_prompt_tokens,
                    "selection": f"training_prompts(seed={seed}, sources=({prompts_source!r},)) order; the first "
                                 f"user turn of the first num_prompts (see runs) encoding to <= "
                                 f"{max_prompt_tokens} tokens"},
        "sampling": sampling_fields(max_new_tokens, temperature, top_p, top_k, stop_ids, template),
    }
    run = {"num_prompts": num_prompts, "target_path": files.resolved, "torch_threads": torch.get_num_threads(),
           "device": device, **precision.record(), "exact_verify": exact_verify}
    return generate_shards(model, prompts, out_dir, fields, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_p=top_p, top_k=top_k, stop_ids=stop_ids, batch_size=batch_size, seed=seed,
                           draft=draft, shard_size=shard_size, run=run, progress=progress, draft_label=draft_label,
                           exact_verify=exact_verify)


def stored_dtype(out_dir: str | Path) -> str:
    """`--dtype auto` of a run that continues a directory: the precision its records were made in (one
    data set, one precision: the manifest refuses a mix); a new directory: `auto`."""
    try:
        manifest = json.loads((Path(out_dir) / "manifest.json").read_text(encoding="utf-8"))
        return str(manifest["target"]["dtype"])
    except (OSError, ValueError, KeyError, TypeError):
        return "auto"


# --------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    from dflash2.data.prompts import TRAINING_SOURCES

    parser = OneLineParser(
        prog="dflash2 regenerate",
        description="Regenerate training responses with the target (resumable: rerun to continue).")
    parser.add_argument("--target", default="smollm2", help="built-in name, local directory or hub id")
    parser.add_argument("--out", required=True, help="output directory of token-id shards")
    parser.add_argument("--num-prompts", type=int, required=True, help="how many prompts to have in total")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="prompt order (and sampling) seed")
    parser.add_argument("--draft", default=None, help="DFlash2 draft directory (lossless speed-up)")
    parser.add_argument("--shard-size", type=int, default=256, help="records per shard")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts")
    parser.add_argument("--source", default="sharegpt", choices=tuple(TRAINING_SOURCES),
                        help="training prompt source (default: sharegpt)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arguments(parser)
    return parser


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM saves finished records, like Ctrl-C
    try:
        args = build_parser().parse_args(argv)
        regenerate(args.target, args.out, args.num_prompts, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, batch_size=args.batch_size, seed=args.seed, draft=args.draft,
                   shard_size=args.shard_size, prompts_source=args.source,
                   max_prompt_tokens=args.max_prompt_tokens, progress=not args.no_progress, device=args.device,
                   dtype=args.dtype, exact_verify=args.exact_verify)
    except DFlash2Error as error:
        print(f"dflash2 regenerate: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dflash2 regenerate: interrupted; finished records are saved, rerun the same command to continue",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
