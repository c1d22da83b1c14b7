"""`dflash2 loadtest`: a bounded load test of a dflash2 server, on loopback only.

Contract: for each mode (`speculative`: the target with its draft; `plain`: `--no-draft`, the same
server code) the load test starts `dflash2 serve` on a free loopback port (or uses `--url`, which
must be a loopback address) and warms it up with one request; then for each concurrency level N,
the modes in turn, it runs the same `--requests` chat requests (greedy, `--max-tokens` each,
benchmark prompts) from N concurrent streaming clients sharing one work list; at the end the
servers are stopped with SIGTERM. It stops by itself: a fixed number of requests per level, each
with a timeout.

Per level it reports: requests/s, output tokens/s, p50/p99 latency and time to first token, the
server's mean acceptance length, errors (non-200, error events, cut streams, timeouts) and greedy
mismatches: each answer's token ids against the engine decoding the same prompt alone
(`decoder.generate`, plain decoding, in this process after the servers are gone). Results go to
`--out` (JSON) and a Markdown table on stdout. Exit status 1 when there were errors or mismatches (or, probed, a /health poll
without a 200 or a big request without an answer).

The probe (`loadprobe`): `--big-body-mb MB` sends one completion body of that size once every
stream of a level has its first token (the streams keep running), and `--health-every-ms MS`
(10 with `--big-body-mb`) polls `/health` through each level; each row then also reports the
polls' median and max round trip (over the level and while the big request was in flight), the
big request's status, and how many streams completed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from dflash2.argparsing import OneLineParser, run_command
from dflash2.data.prompts import BENCHMARKS, load_benchmark
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import require_writable, write_json
from dflash2.runtime.machine import announce_threads
from dflash2.serve.settings import API_KEY_ENV, LOOPBACK_HOSTS
from dflash2.targets.chat import encode_messages
from dflash2.tools.loadprobe import HealthPoller, Probe, big_body, probe_summary, send_big_body

MODES = ("speculative", "plain")
MAX_BIG_BODY_MB = 1024


@dataclass(frozen=True)
class LoadSettings:
    target: str = "smollm2"
    draft: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    speculate: str = "auto"
    threads: int | None = None
    tiny: bool = False
    url: str | None = None
    modes: tuple[str, ...] = ("speculative",)
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 16
    max_tokens: int = 64
    datasets: tuple[str, ...] = ("mt-bench", "gsm8k")
    check: bool = True
    timeout_s: float = 600.0
    out: str | None = None
    api_key: str | None = None          # for --url servers that want one
    probe: Probe = Probe()               # one big body mid-level, /health polled


@dataclass
class Outcome:
    index: int
    ok: bool = False
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)
    latency_s: float = 0.0
    ttft_s: float | None = None
    acceptance_length: float | None = None


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise DFlash2Error(f"{what} must be a comma-separated list of integers, got '{text}'") from None
    require(bool(values) and all(v > 0 for v in values), f"{what} must list positive integers, got '{text}'")
    return values


def parse_settings(argv: list[str]) -> LoadSettings:
    p = OneLineParser(prog="dflash2 loadtest", description="Bounded load test of dflash2 serve on loopback.")
    p.add_argument("--target", default="smollm2")
    p.add_argument("--draft")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--speculate", default="auto", choices=("auto", "always", "never"))
    p.add_argument("--threads", type=int, help="torch threads of the server")
    p.add_argument("--url", help="a running server (loopback only) instead of starting one")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"for --url (default: ${API_KEY_ENV})")
    p.add_argument("--modes", default="speculative", help="speculative and/or plain (comma-separated)")
    p.add_argument("--concurrency", default="1,4,16", help="client counts, one level each")
    p.add_argument("--requests", type=int, default=16, help="requests per level, shared by its clients")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--datasets", default="mt-bench,gsm8k", help="benchmarks the prompts come from, interleaved")
    p.add_argument("--no-check", action="store_true", help="skip the greedy comparison with the engine")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--big-body-mb", type=float, default=0.0,
                   help="send one completion body of this many MiB while each level's streams run")
    p.add_argument("--health-every-ms", type=float, default=None,
                   help="poll /health at this interval through each level (default: 10 with --big-body-mb)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    modes = tuple(m.strip() for m in a.modes.split(",") if m.strip())
    require(bool(modes) and all(m in MODES for m in modes),
            f"--modes must list {' and/or '.join(MODES)}, got '{a.modes}'")
    require(a.url is None or len(modes) == 1, "--url serves one mode: give one --modes value")
    if a.url is not None:
        try:
            scheme, host = urlparse(a.url).scheme, urlparse(a.url).hostname
        except ValueError as err:   # e.g. an unclosed IPv6 bracket
            raise DFlash2Error(f"--url '{a.url}' is not a URL ({err})") from None
        require(scheme in ("http", "https"), f"--url must start with http:// or https://, got '{a.url}'")
        require(host in LOOPBACK_HOSTS,
                f"--url must be a loopback address ({', '.join(LOOPBACK_HOSTS)}), got '{a.url}'")
    require(a.requests > 0, f"--requests must be positive, got {a.requests}")
    require(a.max_tokens > 0, f"--max-tokens must be positive, got {a.max_tokens}")
    require(a.timeout > 0, f"--timeout must be positive, got {a.timeout}")
    if a.out:
        require_writable(a.out, "--out")   # before any server starts: the results are written at the end
    announce_threads(a.threads)
    datasets = tuple(d.strip() for d in a.datasets.split(",") if d.strip())
    require(bool(datasets) and all(d in BENCHMARKS for d in datasets),
            f"--datasets must list benchmarks from {', '.join(BENCHMARKS)}, got '{a.datasets}'")
    return LoadSettings(a.target, a.draft, a.device, a.dtype, a.speculate, a.threads, a.tiny, a.url, modes,
                        _ints(a.concurrency, "--concurrency"), a.requests, a.max_tokens, datasets, not a.no_check,
                        a.timeout, a.out, a.api_key, _probe(a.big_body_mb, a.health_every_ms))


def _probe(big_body_mb: float, health_every_ms: float | None) -> Probe:
    require(math.isfinite(big_body_mb) and 0 <= big_body_mb <= MAX_BIG_BODY_MB,
            f"--big-body-mb must be in 0..{MAX_BIG_BODY_MB}, got {big_body_mb:g}")
    if health_every_ms is None:
        health_every_ms = 10.0 if big_body_mb > 0 else 0.0
    require(math.isfinite(health_every_ms) and 0 <= health_every_ms <= 60_000,
            f"--health-every-ms must be in 0..60000 (0: no polling), got {health_every_ms:g}")
    return Probe(int(big_body_mb * 2**20), health_every_ms / 1000)


def load_prompts(settings: LoadSettings) -> list[str]:
    per = -(-settings.requests // len(settings.datasets))
    sets = [[c.turns[0] for c in load_benchmark(name, per)] for name in settings.datasets]
    mixed = [texts[i] for i in range(per) for texts in sets if i < len(texts)]
    require(len(mixed) >= settings.requests, f"the benchmarks give only {len(mixed)} prompts")
    return mixed[:settings.requests]


# --------------------------------------------------------------------------- the server
class ServerProcess:
    """`dflash2 serve` in a subprocess on a free loopback port; `stop()` sends SIGTERM."""

    def __init__(self, settings: LoadSettings, mode: str, log_path: Path):
        argv = [sys.executable, "-m", "dflash2.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                "--target", settings.target, "--device", settings.device, "--dtype", settings.dtype,
                "--speculate", settings.speculate, "--max-batch", str(max(settings.concurrency)),
                "--max-queue", str(settings.requests), "--log-level", "warning"]
        argv += ["--no-draft"] if mode == "plain" else (["--draft", settings.draft] if settings.draft else [])
        argv += ["--threads", str(settings.threads)] if settings.threads else []
        argv += ["--tiny"] if settings.tiny else []
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env)
        self.url, self.description = self._wait_ready()

    def _wait_ready(self, timeout: float = 600.0) -> tuple[str, str]:
        import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

        deadline = time.time() + timeout
        while time.time() < deadline:
            require(self.proc.poll() is None, f"the server exited: {self.log_path.read_text()[-2000:]}")
            for line in self.log_path.read_text().splitlines():
                if line.startswith("dflash2 serve: http://"):
                    url = line.split()[2]
                    try:
                        if httpx.get(url + "/health", timeout=5).status_code == 200:
                            return url, line.split("|", 1)[1].strip()
                    except httpx.TransportError:
                        pass
            time.sleep(0.2)
        raise DFlash2Error(f"the server did not start within {timeout:.0f} s")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


# --------------------------------------------------------------------------- the clients
async def _one(http, url: str, model: str, prompt: str, index: int, max_tokens: int, timeout: float,
               first_token=lambda: None) -> Outcome:
    outcome, started = Outcome(index), time.perf_counter()
    try:
        await asyncio.wait_for(_stream(http, url, model, prompt, max_tokens, outcome, started, first_token), timeout)
    except asyncio.TimeoutError:
        outcome.ok, outcome.error = False, f"timed out after {timeout:.0f} s"
    except Exception as err:  # noqa: BLE001 - every failure is counted, none stops the run
        outcome.ok, outcome.error = False, f"{type(err).__name__}: {err}"
    outcome.latency_s = time.perf_counter() - started
    return outcome


async def _stream(http, url: str, model: str, prompt: str, max_tokens: int, outcome: Outcome, started: float,
                  first_token) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            outcome.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                outcome.ok = True
                return
            chunk = json.loads(line[6:])
            if "error" in chunk:
                outcome.error = chunk["error"]["message"]
                return
            for choice in chunk.get("choices", []):
                if choice.get("token_ids") and outcome.ttft_s is None:
                    outcome.ttft_s = time.perf_counter() - started
                    first_token()
                outcome.token_ids += choice.get("token_ids") or []
            if chunk.get("dflash2", {}).get("speculative_cycles"):
                outcome.acceptance_length = chunk["dflash2"]["acceptance_length"]
    outcome.error = "the stream ended without [DONE]"


@dataclass
class Level:
    outcomes: list[Outcome]
    wall_s: float
    probe: dict | None = None            # `loadprobe.probe_summary`, when the level was probed


async def run_level(url: str, model: str, prompts: list[str], clients: int, max_tokens: int,
                    timeout: float, api_key: str | None = None, probe: Probe = Probe()) -> Level:
    import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

    work = asyncio.Queue()
    for i in range(len(prompts)):
        work.put_nowait(i)
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = big_body(model, probe.big_body_bytes) if probe.big_body_bytes else None
    all_started, first_tokens = asyncio.Event(), [0]

    def first_token() -> None:
        first_tokens[0] += 1
        if first_tokens[0] >= min(clients, len(prompts)):
            all_started.set()

    async def big_request():
        await all_started.wait()
        return await asyncio.to_thread(send_big_body, url, body, headers, timeout)

    poller = HealthPoller(url, probe.health_every_s) if probe.health_every_s > 0 else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits, headers=headers) as http:
        async def client():
            while not work.empty():
                i = work.get_nowait()
                outcomes.append(await _one(http, url, model, prompts[i], i, max_tokens, timeout, first_token))
            all_started.set()   # a stream that failed before its first token: send the big body anyway

        if poller:
            poller.start()
        started = time.perf_counter()
        big = asyncio.ensure_future(big_request()) if body is not None else None
        try:
            await asyncio.gather(*(client() for _ in range(clients)))
            wall = time.perf_counter() - started
            big_outcome = await big if big is not None else None
        finally:
            answers = poller.stop() if poller else []
    summary = probe_summary(answers, big_outcome, started) if probe.active else None
    return Level(sorted(outcomes, key=lambda o: o.index), wall, summary)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarise(mode: str, clients: int, level: Level) -> dict:
    outcomes, wall = level.outcomes, level.wall_s
    good = [o for o in outcomes if o.ok]
    tokens = sum(len(o.token_ids) for o in good)
    accept = [o.acceptance_length for o in good if o.acceptance_length is not None]
    return {"mode": mode, "concurrency": clients, "requests": len(outcomes), "errors": len(outcomes) - len(good),
            "wall_s": wall, "requests_per_s": len(good) / wall, "output_tokens_per_s": tokens / wall,
            "latency_p50_s": _percentile([o.latency_s for o in good], 50),
            "latency_p99_s": _percentile([o.latency_s for o in good], 99),
            "ttft_p50_s": _percentile([o.ttft_s for o in good if o.ttft_s is not None], 50),
            "ttft_p99_s": _percentile([o.ttft_s for o in good if o.ttft_s is not None], 99),
            "acceptance_length": statistics.mean(accept) if accept else None,
            "first_errors": [o.error for o in outcomes if not o.ok][:3],
            "completed": [o.ok for o in outcomes], **({"probe": level.probe} if level.probe else {})}


# --------------------------------------------------------------------------- references
def references(settings: LoadSettings, prompts: list[str]) -> list[list[int]]:
    """The engine alone on each prompt (plain greedy decoding: the target's own answer)."""
    # the engine (torch, transformers, the targets) loads here, only when a run checks answers
    from dflash2.decoding.loop.engine import GenerationConfig
    from dflash2.pipeline import load_decoder, tiny_pipeline

    if settings.tiny:
        pipe = tiny_pipeline(0, "never")
    else:
        pipe = load_decoder(settings.target, None, settings.device, settings.dtype, no_draft=True)
    config = GenerationConfig(max_new_tokens=settings.max_tokens, stop_token_ids=tuple(pipe.stop_token_ids))
    out = []
    for prompt in prompts:
        ids = encode_messages(pipe.tokenizer, [{"role": "user", "content": prompt}])
        out.append(pipe.decoder.generate([ids], config)[0].tokens)
    return out


def markdown(rows: list[dict]) -> str:
    def f(value, digits=2):
        return "–" if value is None else f"{value:.{digits}f}"

    lines = ["| mode | clients | requests | errors | greedy mismatches | req/s | output tok/s | latency p50 / p99 (s) "
             "| TTFT p50 / p99 (s) | acceptance length |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['concurrency']} | {r['requests']} | {r['errors']} | "
                     f"{'–' if r.get('mismatches') is None else r['mismatches']} | {f(r['requests_per_s'], 3)} | "
                     f"{f(r['output_tokens_per_s'], 1)} | {f(r['latency_p50_s'])} / {f(r['latency_p99_s'])} | "
                     f"{f(r['ttft_p50_s'])} / {f(r['ttft_p99_s'])} | {f(r['acceptance_length'])} |")
    probed = [r for r in rows if r.get("probe")]
    if probed:
        lines += ["", "| mode | clients | streams completed | big body: status (code), s | /health polls | "
                      "/health median / max (ms) | max less the poller's wait for a CPU (ms) | "
                      "during the big body: polls, median / max (ms) |", "|" + "---|" * 8]
    for r in probed:
        health, big = r["probe"]["health"], r["probe"].get("big_body")
        during = r["probe"].get("health_during_big_body")
        shown = "–" if big is None else (f"{big['status']} ({big['code'] or big['error'] or '-'}), "
                                         f"{big['seconds']:.2f}")
        inside = "–" if during is None else f"{during['polls']}, {f(during['median_ms'], 1)} / {f(during['max_ms'], 1)}"
        lines.append(f"| {r['mode']} | {r['concurrency']} | {sum(r['completed'])} / {r['requests']} | {shown} | "
                     f"{health['polls']} ({health['failures']} failed) | {f(health['median_ms'], 1)} / "
                     f"{f(health['max_ms'], 1)} | {f(health.get('max_ms_less_poller_wait'), 1)} | {inside} |")
    return "\n".join(lines) + "\n"


def _connect(url: str, key: str | None, timeout: float) -> str:
    """The served model id, after one warm-up request (not counted)."""
    import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

    auth = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        listing = httpx.get(url + "/v1/models", timeout=30, headers=auth)
    except httpx.TransportError as err:  # nothing listening, a refused or reset connection, a timeout
        raise DFlash2Error(f"no dflash2 server answers at '{url}' ({type(err).__name__}: {err}); start one with "
                           "`dflash2 serve`, or drop --url to let the load test start its own") from None
    require(listing.status_code == 200, f"GET /v1/models: HTTP {listing.status_code} {listing.text[:200]}")
    model = listing.json()["data"][0]["id"]
    warm = asyncio.run(run_level(url, model, ["Say hello."], 1, 8, timeout, key)).outcomes
    require(warm[0].ok, f"the warm-up request failed: {warm[0].error}")
    return model


def run(settings: LoadSettings, command: str = "dflash2 loadtest") -> dict:
    """All servers are started first; then at each concurrency level the modes take turns, so a
    shared machine's changing background load falls on both modes alike."""
    from dflash2.runtime.provenance import git_commit, machine_info   # torch and transformers: only for a run

    prompts = load_prompts(settings)
    rows, answers, servers, running = [], {}, {}, {}
    log_dir = Path(settings.out).parent if settings.out else Path.cwd()
    log_dir.mkdir(parents=True, exist_ok=True)
    key = settings.api_key if settings.url else None
    try:
        for mode in settings.modes:
            if settings.url:
                url, description = settings.url.rstrip("/"), "external server"
            else:
                print(f"# starting the {mode} server ...", file=sys.stderr, flush=True)
                running[mode] = ServerProcess(settings, mode, log_dir / f"loadtest-serve-{mode}.log")
                url, description = running[mode].url, running[mode].description
            servers[mode] = {"url": url, "description": description, "model": _connect(url, key, settings.timeout_s)}
        for clients in settings.concurrency:
            for mode in settings.modes:
                server = servers[mode]
                level = asyncio.run(run_level(server["url"], server["model"], prompts, clients, settings.max_tokens,
                                              settings.timeout_s, key, settings.probe))
                row = summarise(mode, clients, level)
                rows.append(row)
                answers[(mode, clients)] = level.outcomes
                print(f"# {mode} x{clients}: {row['requests_per_s']:.3f} req/s, {row['output_tokens_per_s']:.1f} "
                      f"tok/s, {row['errors']} errors", file=sys.stderr, flush=True)
    finally:
        for mode, process in running.items():
            servers[mode]["exit_status"] = process.stop()
    if settings.check:
        print("# greedy references from the engine ...", file=sys.stderr, flush=True)
        want = references(settings, prompts)
        for row in rows:
            outcomes = answers[(row["mode"], row["concurrency"])]
            row["mismatches"] = sum(1 for o in outcomes if o.ok and o.token_ids != want[o.index])
    shown = {**asdict(settings), "api_key": "***" if settings.api_key else None}
    return {"command": command, "commit": git_commit(), "machine": machine_info(), "settings": shown,
            "servers": servers, "rows": rows}


def _probe_failures(probe: dict | None) -> int:
    """Polls of /health that got no 200, and a big body the server did not answer at all."""
    if not probe:
        return 0
    return probe["health"]["failures"] + int(bool(probe.get("big_body", {}).get("error")))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = parse_settings(argv)
    shown = ["***" if i and argv[i - 1] == "--api-key" else a for i, a in enumerate(argv)]
    results = run(settings, " ".join(["dflash2 loadtest", *shown]))
    if settings.out:
        write_json(settings.out, results)
    print(markdown(results["rows"]))
    bad = sum(r["errors"] + (r.get("mismatches") or 0) + _probe_failures(r.get("probe")) for r in results["rows"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_command(main))
