"""Regenerate training responses with the target itself (docs/spec.md §4: the draft imitates the target).

It runs the target (and optionally a draft) through the decoding engine, so it lives with training,
not in `data/` (which only reads, writes and selects data).

Contract:
- `regenerate(target, out_dir, num_prompts, ...)` takes the prompts -- the built-in training prompts
  of `prompts_source` (`prompt_sets.encode_training_prompts`: the first user turn, seeded order) or a
  user's `prompts_file` (`data.chat_files`: prompts, OpenAI messages or ShareGPT conversations; each
  record's messages up to its last user message) -- keeps the first `num_prompts` (a file: all by
  default) whose encoding has at most `max_prompt_tokens` tokens, generates the responses and stores
  them as token-id shards (`shards.py`). The responses come from the engine here (autoregressive,
  or speculative with `draft`, which is lossless), or from an OpenAI-compatible `endpoint`
  (`training.endpoint`: `concurrency` requests in flight, after it is proved to serve this target:
  tokenizer fingerprint and a greedy probe against the local target, refused in one line
  otherwise). With `off_policy` nothing is decoded: the file's own assistant turns are stored as the
  responses (`data.off_policy`; the manifest's `sampling.off_policy` says so). Returns a summary
  dict (records added and stored, response tokens and tokens/s of this run). Every setting, the
  prompt file, the output directory and the draft (its weights, and that it was made for this
  target) are checked before the target's weights load; the endpoint is reached (its model list)
  before they load too.
- `generate_shards(model, prompts, out_dir, manifest_fields, ...)` is the tokenizer-free core:
  `prompts` are `Prompt(id, tokens)`. Pending prompts, shortest first, are decoded by one engine
  session with continuous batching: up to `batch_size` rows at once, a finished row's record
  stored at once and its place taken by the next prompt at the next cycle boundary (in-place KV,
  ragged rows; no fixed batch waiting for its longest answer). Each response keeps its stop token;
  a sampled row's seed depends only on the run's seed and the prompt id.
- Resumable: rerunning the same command (any `num_prompts`) skips ids already stored, so nothing is
  duplicated; settings that change the data (target, tokenizer, prompt selection, sampling) must
  equal the existing manifest's, else a one-line `DFlash2Error`. Interrupting (Ctrl-C or SIGTERM)
  saves every finished record before exiting. The draft, batch size, shard size and the endpoint
  may change between runs (local and endpoint runs continue each other: the same fields); they are
  recorded per run in the manifest's `runs`. Records are written in the queue's order (shortest
  prompt first), whatever the batch size or concurrency, so at T=0 the shards of the same prompts
  are the same bytes locally and through an endpoint that serves the same target.
- `device` / `dtype` (`--device`, `--dtype`, default `auto`: `runtime.devices.resolve_precision`,
  or, continuing a directory, the precision its records were made in) are checked before anything
  loads and recorded: the target's dtype in the manifest's `target` (a field that must match on
  every run), the device, the precision's reason and `--exact-verify` in each run's entry.
- `main(argv)` is the command line (`dflash2 regenerate` calls it): returns 0, 2 on a user error
  (one line on stderr) or 130 when interrupted.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import zlib
from collections import deque
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from dflash2.argparsing import OneLineParser, add_device_arguments, say as command_say
from dflash2.targets.chat import stop_token_ids
from dflash2.decoding.loop.context import check_context
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers.kinds import block_size, decoder_default
from dflash2.decoding.verifier.adapter import context_limit
from dflash2.model.families import load_draft
from dflash2.model.shape import target_text_config
from dflash2.errors import DFlash2Error, require
from dflash2.runtime.machine import announce_threads, use_threads
from dflash2.data.shards import InOrder, Record, ShardWriter
from dflash2.training.data_identity import sampling_fields, target_fields, tokenizer_fields
from dflash2.training.prompt_sets import Prompt, encode_training_prompts  # noqa: F401 (their home before)
from dflash2.decoding.verifier.adapter import TargetAdapter


say = partial(command_say, who="dflash2 regenerate")


def check_fits_context(prompts: list[Prompt], files, draft, max_new_tokens: int) -> None:
    """The engine's context rule for the longest prompt, before the target's weights load."""
    block = block_size(decoder_default(draft is not None), None if draft is None else draft.config.block_size, None)
    longest = max(len(p.tokens) for p in prompts) if prompts else 1
    try:
        check_context(longest, max_new_tokens, block, context_limit(target_text_config(files.config)))
    except DFlash2Error as err:
        raise DFlash2Error(f"--max-new-tokens {max_new_tokens}: the longest prompt does not fit ({err})") from None


# --------------------------------------------------------------------------- generation

def _queue(prompts: list[Prompt]) -> deque[Prompt]:
    """Shortest prompts first (ties by id): rows decoding side by side have similar widths."""
    return deque(sorted(prompts, key=lambda p: (len(p.tokens), p.id)))


class Progress:
    """The progress bar and the line per shard written, of a run over `total` prompts."""

    def __init__(self, writer: ShardWriter, total: int, enabled: bool):
        self.writer, self.total, self.done, self.new_tokens = writer, total, 0, 0
        self.started, self.shards = time.perf_counter(), len(writer.manifest["shards"])
        self.bar = tqdm(total=total, unit="rec", desc="regenerate", file=sys.stderr, dynamic_ncols=True,
                        mininterval=1.0 if sys.stderr.isatty() else 60.0, disable=not enabled)

    def finished(self, tokens: int) -> None:
        self.done += 1
        self.new_tokens += tokens
        self.bar.update(1)

    def tick(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.new_tokens / elapsed:.0f} tok/s", refresh=False)
        for shard in self.writer.manifest["shards"][self.shards:]:
            eta = (self.total - self.done) * elapsed / max(self.done, 1)
            say(f"wrote {shard['file']} ({shard['records']} records, {self.writer.manifest['counts']['records']} "
                 f"stored): {self.new_tokens / elapsed:.1f} tok/s, {self.done * 3600 / elapsed:.0f} records/h, "
                 f"{self.total - self.done} to go, ETA {eta / 3600:.2f} h")
        self.shards = len(self.writer.manifest["shards"])

    def close(self) -> None:
        self.bar.close()


def _decode_into(decoder: SpeculativeDecoder, writer: ShardWriter, pending: list[Prompt], progress: bool,
                 batch_size: int, stop_ids, seed: int, deadline: float | None = None, **sampling) -> int:
    """Decode the pending prompts with continuous batching into the writer; returns the response
    tokens made. At most `batch_size` rows decode at once in one engine session; a finished row's
    place is taken by the next prompt at the next cycle boundary, so no row waits for the longest
    answer of a fixed batch. Records are written in the queue's order (`shards.InOrder`), so the
    shards do not depend on the batch size. A row's seed depends only on `seed` and its prompt id.
    From `deadline` (epoch seconds) on no prompt is admitted; the live rows finish."""
    queue, live = _queue(pending), {}
    in_order = InOrder(writer, [p.id for p in queue])
    session = decoder.session()
    bar = Progress(writer, len(pending), progress)
    try:
        while queue or session:
            if deadline is not None and time.time() >= deadline:
                queue.clear()
            while queue and len(live) < batch_size:
                prompt = queue.popleft()
                config = GenerationConfig(**sampling, stop_token_ids=tuple(stop_ids),
                                          seed=zlib.crc32(f"{seed}:{prompt.id}".encode()))
                live[session.add([prompt.tokens], config)[0]] = prompt
            for event in session.step():
                if event.result is None:
                    continue
                prompt = live.pop(event.key)
                in_order.put(prompt.id, Record(prompt.id, prompt.tokens, event.result.tokens,
                                               event.result.finish_reason))
                bar.finished(len(event.result.tokens))
            bar.tick()
    finally:
        in_order.drain()     # an interruption or a deadline: what finished is stored all the same
        bar.close()
    return bar.new_tokens


def _store(items: list, out_dir, manifest_fields: dict, shard_size: int, run: dict, fill,
           doing: str = "generate") -> dict:
    """One writer session over `items` (anything with an `.id`): `fill(writer, pending)` stores the
    pending ones and returns the response tokens it made; returns the run's summary."""
    with ShardWriter(out_dir, manifest_fields, shard_size=shard_size, run=run) as writer:
        pending = [item for item in items if item.id not in writer.ids]
        stored_before = writer.manifest["counts"]["records"]
        say(f"{len(items)} {'prompts' if doing == 'generate' else 'records'}: {len(items) - len(pending)} already "
             f"stored, {len(pending)} to {doing} into {out_dir}")
        started = time.perf_counter()
        new_tokens = fill(writer, pending)
    elapsed = time.perf_counter() - started
    counts = writer.manifest["counts"]
    summary = {"records_added": counts["records"] - stored_before, "records_stored": counts["records"],
               "response_tokens_added": new_tokens, "seconds": round(elapsed, 1),
               "tokens_per_second": round(new_tokens / elapsed, 1) if elapsed else 0.0,
               "shards": len(writer.manifest["shards"]),
               "prompts_left": sum(item.id not in writer.ids for item in items)}
    say(f"done: {json.dumps(summary)}")
    return summary


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
    if isinstance(draft, (str, Path)):   # a DFlash draft or an MTP head (`model.families`)
        draft = load_draft(str(draft)).to(next(model.parameters()).device).eval()
    run = {**(run or {}), "batch_size": batch_size, "shard_size": shard_size, "draft": draft_label}
    adapter = TargetAdapter(model, None if draft is None else draft.config.target_layer_ids, exact_verify=exact_verify)
    try:
        decoder = SpeculativeDecoder(adapter, draft)
        return _store(prompts, out_dir, manifest_fields, shard_size, run, lambda writer, pending: _decode_into(
            decoder, writer, pending, progress, batch_size, stop_ids, seed, deadline=deadline,
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k))
    finally:
        adapter.close()


def _greedy(model, prompt: list[int], max_new_tokens: int, stop_ids) -> list[int]:
    """The local target's greedy answer to one prompt."""
    adapter = TargetAdapter(model, None)
    try:
        [result] = SpeculativeDecoder(adapter, None).generate(
            [prompt], GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=tuple(stop_ids)))
    finally:
        adapter.close()
    return result.tokens


def _through_endpoint(model, remote, prompts: list[Prompt], out_dir, fields: dict, shard_size: int, run: dict,
                      concurrency: int, seed: int, progress: bool) -> dict:
    """Prove the endpoint serves this target (`endpoint.prove_same_target`), then regenerate through it."""
    from dflash2.training.endpoint import PROBE_TOKENS, prove_same_target, request_into

    probe, length = _queue(prompts)[0], min(PROBE_TOKENS, remote.sampling["max_new_tokens"])
    checked = prove_same_target(remote, probe.tokens, _greedy(model, probe.tokens, length, remote.stops), length)
    say(f"{remote.endpoint.base} serves this target (tokenizer fingerprint {checked['tokenizer_fingerprint']}, "
         f"greedy probe of {checked['greedy_probe_tokens']} tokens equal); {concurrency} requests at a time")
    run = {**run, "endpoint": remote.endpoint.base, "endpoint_model": remote.model, "concurrency": concurrency,
           "shard_size": shard_size, **checked}

    def fill(writer: ShardWriter, pending: list[Prompt]) -> int:
        bar = Progress(writer, len(pending), progress)
        try:
            dropped = request_into(remote, writer, list(_queue(pending)), concurrency, seed, bar)
        finally:
            bar.close()
            writer.run["token_ids"] = remote.token_ids
        if dropped:
            writer.run["answers_not_stored"] = dropped
            say(f"{dropped} answers were not stored: their text does not re-encode to itself with this tokenizer")
        return bar.new_tokens

    return _store(prompts, out_dir, fields, shard_size, run, fill)


def check_settings(batch_size: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    require(isinstance(batch_size, int) and batch_size > 0, f"batch_size must be a positive integer, got {batch_size!r}")
    GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k).validate()


def _positive(value, name: str, optional: bool = False) -> None:
    require((optional and value is None) or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
            f"{name} must be a positive integer, got {value!r}")


def regenerate(target: str, out_dir: str | Path, num_prompts: int | None = None, max_new_tokens: int = 256,
               temperature: float = 0.0, batch_size: int = 16, seed: int = 0, draft=None, shard_size: int = 256,
               prompts_source: str | None = None, max_prompt_tokens: int = 512, top_p: float = 1.0,
               top_k: int = 0, progress: bool = True, prompts_file: str | Path | None = None,
               off_policy: bool = False, endpoint: str | None = None, endpoint_model: str | None = None,
               api_key: str | None = None, concurrency: int = 8, request_timeout_s: float = 600.0,
               device: str = "cpu", dtype: str = "auto", exact_verify: bool = False) -> dict:
    """Regenerate the responses of `num_prompts` training prompts (or a user's `prompts_file`) with
    `target` (or through `endpoint`) into `out_dir`; with `off_policy`, store the file's own answers.
    Every setting, the file, the output directory and the draft are checked before the target loads."""
    from dflash2.data.chat_files import load_chat_file
    from dflash2.runtime.devices import settle
    from dflash2.data.shards import check_output_dir
    from dflash2.pipeline import check_draft_fits
    from dflash2.targets.builtin import load_target_model, open_target
    from dflash2.training import prompt_sets
    from dflash2.training.endpoint import Endpoint

    _positive(num_prompts, "num_prompts", optional=prompts_file is not None)
    _positive(max_prompt_tokens, "max_prompt_tokens")
    _positive(shard_size, "shard_size")
    _positive(concurrency, "concurrency")
    require(prompts_file is None or prompts_source is None, "give --source or --prompts, not both")
    require(not off_policy or prompts_file is not None, "--off-policy stores the answers of a --prompts FILE; give one")
    require(not (off_policy and (endpoint or draft)), "--off-policy decodes nothing: it takes no --endpoint or --draft")
    require(not (endpoint and draft), "--draft speeds up local decoding; an --endpoint decodes with its own settings")
    check_settings(batch_size, max_new_tokens, temperature, top_p, top_k)
    check_output_dir(out_dir)
    device, precision = settle(device, stored_dtype(out_dir) if dtype == "auto" else dtype)
    chats = load_chat_file(prompts_file) if prompts_file is not None else None
    remote_end = Endpoint(endpoint, api_key, request_timeout_s) if endpoint else None
    draft_label = None if draft is None else str(draft)
    if isinstance(draft, (str, Path)):
        draft = load_draft(draft)
    files = open_target(target)
    if draft is not None:
        check_draft_fits(draft.config, files, draft_label)
    tokenizer, name = files.tokenizer, Path(prompts_file).stem if prompts_file is not None else None
    if off_policy:
        return _off_policy(files, chats, name, prompts_file, out_dir, num_prompts, max_prompt_tokens, max_new_tokens,
                           shard_size)
    if chats is not None:
        prompts = prompt_sets.encode_file_prompts(tokenizer, chats, name, num_prompts, max_prompt_tokens)
        prompt_fields = prompt_sets.file_fields(prompts_file, max_prompt_tokens)
    else:
        prompts_source = prompts_source or "sharegpt"
        prompts = encode_training_prompts(tokenizer, num_prompts, seed, prompts_source, max_prompt_tokens)
        prompt_fields = prompt_sets.training_fields(prompts_source, seed, max_prompt_tokens)
    check_fits_context(prompts, files, draft, max_new_tokens)
    if exact_verify:
        from dflash2.decoding.verifier.exact import check_plan

        check_plan(target_text_config(files.config), device, precision.torch_dtype)
    remote_model = _served_model(remote_end, endpoint_model) if remote_end else None   # reachable, before weights load
    model = load_target_model(files, device, precision.torch_dtype)
    if draft is not None:
        draft = draft.to(device)
    stop_ids = stop_token_ids(tokenizer, model.config)
    sampling = sampling_fields(max_new_tokens, temperature, top_p, top_k, stop_ids, getattr(tokenizer, "chat_template", None))
    if chats is not None and sampling["chat_template_sha256"]:
        sampling["chat_template"] = "target's own, the record's messages up to its last user message, generation prompt added"
    fields = {"target": target_fields(target, model), "tokenizer": tokenizer_fields(tokenizer),
              "prompts": prompt_fields, "sampling": sampling}
    run = {"num_prompts": num_prompts, "target_path": files.resolved, "torch_threads": torch.get_num_threads(),
           "device": device, **precision.record(), "exact_verify": exact_verify}
    if remote_end is not None:
        from dflash2.training.endpoint import RemoteTarget

        remote = RemoteTarget(remote_end, remote_model, tokenizer, stop_ids,
                              {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k})
        return _through_endpoint(model, remote, prompts, out_dir, fields, shard_size, run, concurrency, seed, progress)
    say(f"target {target} on {device}, {precision.describe()}{', exact verify' if exact_verify else ''}")
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


def _served_model(endpoint, wanted: str | None) -> str:
    served = endpoint.models()
    if wanted is not None:
        require(wanted in served, f"the endpoint {endpoint.base} does not serve '{wanted}' (it serves: "
                                  f"{', '.join(served) or 'nothing'})")
        return wanted
    require(len(served) == 1, f"the endpoint {endpoint.base} serves {len(served)} models "
                              f"({', '.join(served) or 'none'}); name one with --endpoint-model")
    return served[0]


def _off_policy(files, chats, name: str, path, out_dir, num_prompts, max_prompt_tokens: int, max_new_tokens: int,
                shard_size: int) -> dict:
    """Store a user's conversations with their own answers (no decoding: off-policy data)."""
    from dflash2.targets.builtin import load_target_model
    from dflash2.training import prompt_sets

    tokenizer = files.tokenizer
    model = load_target_model(files)     # its fingerprint and stop tokens, for the manifest
    stop_ids = stop_token_ids(tokenizer, model.config)
    records = prompt_sets.off_policy_records(tokenizer, chats, name, stop_ids, num_prompts, max_prompt_tokens,
                                             max_new_tokens)
    template = getattr(tokenizer, "chat_template", None)
    fields = {"target": target_fields(files.name, model), "tokenizer": tokenizer_fields(tokenizer),
              "prompts": {**prompt_sets.file_fields(path, max_prompt_tokens),
                          "selection": "every answered assistant turn of the file's first num_prompts (see runs) "
                                       "conversations, the messages before it as the prompt"},
              "sampling": {"off_policy": True, "responses": "the file's own assistant turns, not the target's",
                           "max_new_tokens": max_new_tokens, "stop_token_ids": sorted(int(i) for i in stop_ids),
                           "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None}}
    run = {"num_prompts": num_prompts, "target_path": files.resolved, "off_policy": True, "shard_size": shard_size}

    def fill(writer: ShardWriter, pending: list[Record]) -> int:
        for record in pending:
            writer.add(record)
        return sum(int(r.response.size) for r in pending)

    say("off-policy: the responses are the file's own answers, not the target's")
    return _store(records, out_dir, fields, shard_size, run, fill, doing="store")


# --------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    from dflash2.data.prompts import TRAINING_SOURCES

    parser = OneLineParser(
        prog="dflash2 regenerate",
        description="Regenerate training responses with the target, here or through an OpenAI-compatible endpoint "
                    "(resumable: rerun to continue).")
    parser.add_argument("--target", default="smollm2", help="built-in name, local directory or hub id")
    parser.add_argument("--out", required=True, help="output directory of token-id shards")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="how many prompts to have in total (needed with --source; default with --prompts: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="prompt order (and sampling) seed")
    parser.add_argument("--draft", default=None, help="DFlash2 draft directory (lossless speed-up)")
    parser.add_argument("--shard-size", type=int, default=256, help="records per shard")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts")
    parser.add_argument("--source", default=None, choices=tuple(TRAINING_SOURCES),
                        help="built-in training prompt source (default: sharegpt)")
    parser.add_argument("--prompts", default=None, metavar="FILE",
                        help="your own prompts: JSON Lines (or one JSON array) of {\"prompt\": ...}, OpenAI "
                             "{\"messages\": [...]} or ShareGPT {\"conversations\": [...]} records")
    parser.add_argument("--off-policy", action="store_true",
                        help="with --prompts: store the file's own assistant turns as the responses instead of "
                             "regenerating them (off-policy data: no decoding)")
    remote = parser.add_argument_group("through an OpenAI-compatible server (vLLM, SGLang, llama-server, dflash2 serve)")
    remote.add_argument("--endpoint", default=None, metavar="URL", help="the server's base URL, e.g. http://host:8000")
    remote.add_argument("--endpoint-model", default=None, help="the served model id (default: the only one)")
    remote.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or None,
                        help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")
    remote.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 8)")
    remote.add_argument("--request-timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice); "
                        "on a shared machine 1 thread can be far steadier")
    add_device_arguments(parser, weights=False)
    return parser


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM saves finished records, like Ctrl-C
    try:
        args = build_parser().parse_args(argv)
        require(args.prompts is not None or args.num_prompts is not None, "--num-prompts is required with --source "
                                                                          "(or give --prompts FILE)")
        require(args.endpoint is not None or args.concurrency is None,
                "--concurrency sets the requests in flight to an --endpoint; give one (local decoding: --batch-size)")
        announce_threads(args.threads)
        use_threads(args.threads)
        regenerate(args.target, args.out, args.num_prompts, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, batch_size=args.batch_size, seed=args.seed, draft=args.draft,
                   shard_size=args.shard_size, prompts_source=args.source, max_prompt_tokens=args.max_prompt_tokens,
                   top_p=args.top_p, top_k=args.top_k, progress=not args.no_progress, prompts_file=args.prompts,
                   off_policy=args.off_policy, endpoint=args.endpoint, endpoint_model=args.endpoint_model,
                   api_key=args.api_key, concurrency=8 if args.concurrency is None else args.concurrency,
                   request_timeout_s=args.request_timeout, device=args.device, dtype=args.dtype,
                   exact_verify=args.exact_verify)
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
