"""`dflash2 serve`: the command line of the server.

Contract: `main(argv)` parses the options into `ServeSettings`, checks them and claims the
listening socket before anything is loaded (a bad option or a busy port is one `DFlash2Error`
line, exit 2, via `dflash2.cli`), then loads the target and draft (`--tiny`, hidden: the tiny
random test models), prints one line `dflash2 serve: http://HOST:PORT ...` on stderr and serves
until SIGINT or SIGTERM. SIGTERM drains: no new connections, the requests in flight finish
(up to `--drain-timeout` seconds; those still open then end with a 503 error, in a stream an
`error` event), then the process exits with status 0.

Once loaded, the heap is settled (`settle_heap`: the collector no longer rescans the models'
objects, whose full collections paused the server for up to 0.7 s).
`run_server(pipeline, settings, sock)` serves an already loaded pipeline on an open socket
(tests start it in a thread); `bind(host, port)` opens that socket (port 0: a free port) and
listens on it at once, so a client that connects as soon as the `dflash2 serve:` line appears
waits in the backlog while the server finishes starting, instead of being refused.
"""
from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import socket
import sys

from dflash2.argparsing import (OneLineParser, add_device_arguments, add_recalibrate_argument, apply_recalibrate,
                                run_command)
from dflash2.runtime.devices import check_device
from dflash2.runtime.machine import use_threads
from dflash2.errors import DFlash2Error, require
from dflash2.serve.settings import API_KEY_ENV, RequestDefaults, ServeSettings
from dflash2.serve.spec_decode import LEVELS


def build_parser() -> argparse.ArgumentParser:
    d, r = ServeSettings(), RequestDefaults()
    p = OneLineParser(prog="dflash2 serve", description="OpenAI-compatible server with continuous batching over the "
                                                 "DFlash2 speculative decoder (lossless: greedy answers are the "
                                                 "target's own).")
    p.add_argument("--target", default=d.target, help="built-in name (smollm2, gemma3), local HF dir or hub id")
    p.add_argument("--draft", help="draft checkpoint directory (default: the shipped draft for the target)")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding (same server)")
    add_device_arguments(p)
    p.add_argument("--draft-dtype", default=d.draft_dtype)
    p.add_argument("--speculate", default=d.speculate, choices=("auto", "always", "never"),
                   help="auto: verify only the drafts that pay and fall back to plain decoding; always; never")
    p.add_argument("--proposer", default=None, choices=("draft", "lookup", "hybrid", "mtp"),
                   help="where proposed tokens come from: draft, lookup (the request's own text and recent "
                        "requests'; loads no draft), hybrid (both, per row and cycle, or both as a tree), mtp (an "
                        "MTP head: --draft DIR, else the target's own); default: hybrid (lookup for a target with "
                        "no trained draft)")
    p.add_argument("--host", default=d.host, help="address to listen on (default loopback only)")
    p.add_argument("--port", type=int, default=d.port, help="port (0: any free port)")
    p.add_argument("--model-name", help="model id clients send (default: the target's name)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="rows decoded together")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="requests that may wait for a row; more: 429")
    p.add_argument("--retry-after", type=int, default=d.retry_after_s, help="Retry-After seconds sent with a 429")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV})")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s,
                   help="on SIGTERM, seconds the requests in flight may take to finish")
    p.add_argument("--max-request-mb", type=float, default=d.max_request_bytes / 2**20,
                   help="largest request body in MiB; a larger one gets 413")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--per-request-spec-decode-metrics", default=d.per_request_spec_decode_metrics,
                   choices=LEVELS, help="as vLLM's: each response (a stream: its usage chunk) carries "
                                        "metrics.speculative_decoding; detailed adds every cycle (default: none)")
    g = p.add_argument_group("generation defaults (for fields a request leaves out)")
    g.add_argument("--max-tokens", type=int, default=r.max_tokens, help="capped to the room left in the context")
    g.add_argument("--temperature", type=float, default=r.temperature, help="0: greedy (OpenAI's default is 1)")
    g.add_argument("--top-p", type=float, default=r.top_p)
    g.add_argument("--top-k", type=int, default=r.top_k)
    g.add_argument("--seed", type=int, default=r.seed, help="default: a fresh seed per request")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    add_recalibrate_argument(p)
    return p


def parse_settings(argv: list[str]) -> ServeSettings:
    a = build_parser().parse_args(argv)
    settings = ServeSettings(
        target=a.target, draft=a.draft, no_draft=a.no_draft, device=check_device(a.device), dtype=a.dtype,
        exact_verify=a.exact_verify, weights=a.weights,
        draft_dtype=a.draft_dtype, speculate=a.speculate, proposer=a.proposer, tiny=a.tiny, host=a.host, port=a.port,
        model_name=a.model_name, max_batch=a.max_batch, max_queue=a.max_queue, retry_after_s=a.retry_after,
        api_key=a.api_key, drain_timeout_s=a.drain_timeout,
        max_request_bytes=_mebibytes(a.max_request_mb), log_level=a.log_level.lower(),
        access_log=a.access_log, threads=a.threads,
        per_request_spec_decode_metrics=a.per_request_spec_decode_metrics,
        defaults=RequestDefaults(a.max_tokens, a.temperature, a.top_p, a.top_k, a.seed))
    settings.validate()
    apply_recalibrate(a)
    return settings


def _mebibytes(value: float) -> int:
    require(math.isfinite(value) and value > 0, f"--max-request-mb must be a positive number, got {value:g}")
    return int(value * 2**20)


LISTEN_BACKLOG = 2048   # uvicorn's own default


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)   # from here a client connects (and waits) instead of being refused
    except OSError as err:
        raise DFlash2Error(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def load_pipeline(settings: ServeSettings):
    # the targets and the draft's model code (seconds) load here, after the options are checked and the
    # socket is claimed, so a bad option or a busy port answers at once
    from dflash2.pipeline import load_decoder, tiny_pipeline

    use_threads(settings.threads)
    if settings.tiny:
        pipeline = tiny_pipeline(0, "never" if settings.no_draft else settings.speculate)
    else:
        from dflash2.decoding.proposers.lookup import SuffixStore

        pipeline = load_decoder(settings.target, settings.draft, settings.device, settings.dtype, settings.no_draft,
                                settings.draft_dtype, settings.speculate, settings.proposer,
                                exact_verify=settings.exact_verify, weights=settings.weights)
        pipeline.decoder.suffix_store = SuffixStore()   # lookup proposals from recent requests too (bounded)
    settle_heap()
    return pipeline


def settle_heap() -> None:
    """Move everything loaded so far out of the garbage collector's sight (`gc.freeze`): torch,
    transformers and the tokenizer leave a few hundred thousand long-lived objects, and a full
    collection over them held the GIL for 0.3-0.7 s, freezing `/health` and every stream."""
    gc.collect()
    gc.freeze()


def make_server(pipeline, settings: ServeSettings):
    from dflash2.serve.server import make_server as make  # uvicorn and FastAPI load only once the options are good

    return make(pipeline, settings)


def run_server(pipeline, settings: ServeSettings, sock: socket.socket) -> None:
    make_server(pipeline, settings).run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(list(sys.argv[1:] if argv is None else argv))
    sock = bind(settings.host, settings.port)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    pipeline = load_pipeline(settings)
    print(f"dflash2 serve: {url_of(sock)} | model {settings.served_model} | draft {pipeline.draft_description} | "
          f"speculate {pipeline.decoder.speculate} | {pipeline.header()} | max batch {settings.max_batch}, max queue {settings.max_queue}"
          f"{' | API key required' if settings.api_key else ''}", file=sys.stderr, flush=True)
    # uvicorn drains on SIGTERM, then re-raises it to the handler found here: make that a no-op,
    # so a drained server exits with status 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    run_server(pipeline, settings, sock)
    print("dflash2 serve: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
