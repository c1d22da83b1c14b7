"""The load test's probe: one large request sent in the middle of a level, and `/health` polled
beside the streams, so that what one request costs everyone else is measured.

Contract:
- `Probe(big_body_bytes, health_every_s)`: the scenario of one level. `big_body_bytes` > 0: once
  every stream of the level has its first token, one completion request whose body is that many
  bytes (a prompt of "hello world " repeated, `max_tokens` 1) is sent on its own connection;
  `health_every_s` > 0: `GET /health` is polled at that interval on its own keep-alive connection
  from the level's start to its end.
- `HealthPoller(url, every_s)`: that poller, in a process of its own (see the class): `start()`,
  then `stop()` -> the `HealthAnswer`s (when sent, round trip, status, a failed poll is status 0;
  and how long the poller itself waited for a CPU during the poll, `cpu_wait_s()`: on a saturated
  host the answer can sit in the poller's socket for 100 ms while the server took 1 ms, so the
  round trip less that wait is what the server cost).
- `big_body(model, size)` -> the request body, built before the level starts (building 20 MB of
  JSON during the level would stall the client, not the server).
- `send_big_body(url, body, headers, timeout)` -> `BigBody` (status, error code, when sent and
  answered): blocking, run in a thread.
- `probe_summary(answers, big, started)` -> the row's `probe` figures: polls, failures, median and
  max round trip over the whole level and while the big request was in flight, the max round trip
  less the poller's own wait for a CPU, and when (seconds from the level's start) the slowest
  polls and the big request were sent.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from dflash2.errors import require

FILLER = "hello world "
READY = "polling"
SLOWEST = 5   # the slowest polls reported: [s since the level's start, sent, round trip ms, poller's CPU wait ms]


@dataclass(frozen=True)
class Probe:
    big_body_bytes: int = 0
    health_every_s: float = 0.0

    @property
    def active(self) -> bool:
        return self.big_body_bytes > 0 or self.health_every_s > 0


@dataclass(frozen=True)
class HealthAnswer:
    sent: float            # perf_counter when the poll was sent
    seconds: float         # its round trip
    status: int            # 0: no answer (a transport error or a timeout)
    poller_wait: float = 0.0   # of the round trip, the time the poller was runnable but had no CPU

    @property
    def server_seconds(self) -> float:
        """The round trip less the poller's own wait for a CPU."""
        return max(0.0, self.seconds - self.poller_wait)


@dataclass
class BigBody:
    bytes: int
    sent: float = 0.0
    answered: float = 0.0
    status: int = 0
    code: str | None = None
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.answered - self.sent


class HealthPoller:
    """Polls from a process of its own (`python -m dflash2.tools.loadprobe URL EVERY_S`), which
    imports nothing but httpx: a poller sharing the load generator's interpreter would also time
    that interpreter's own pauses (its garbage collector, the streams' parsing), not the server's."""

    def __init__(self, url: str, every_s: float, timeout_s: float = 30.0):
        self.url, self.every_s, self.timeout_s = url, every_s, timeout_s
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "dflash2.tools.loadprobe", self.url, str(self.every_s),
                                       str(self.timeout_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        require(self._proc.stdout.readline().strip() == READY, "the /health poller did not start")

    def stop(self) -> list[HealthAnswer]:
        out, _ = self._proc.communicate("stop\n", timeout=self.timeout_s + 30)
        return [HealthAnswer(*json.loads(line)) for line in out.splitlines() if line.strip()]


def cpu_wait_s() -> float:
    """How long the calling thread has waited, runnable, for a CPU (Linux schedstat); 0.0 where the
    kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def poll(url: str, every_s: float, timeout_s: float) -> None:
    """The poller process: polls until a line (or end of file) arrives on stdin, then writes one
    JSON line `[sent, seconds, status, poller_wait]` per poll on stdout."""
    import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

    stop, answers = threading.Event(), []
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    with httpx.Client(timeout=timeout_s) as http:
        print(READY, flush=True)
        while not stop.is_set():
            waited = cpu_wait_s()
            sent = time.perf_counter()          # CLOCK_MONOTONIC: the same clock as the load test's
            try:
                status = http.get(url + "/health").status_code
            except httpx.HTTPError:
                status = 0
            answers.append((sent, time.perf_counter() - sent, status, cpu_wait_s() - waited))
            stop.wait(every_s)
    sys.stdout.write("".join(json.dumps(a) + "\n" for a in answers))


def big_body(model: str, size: int) -> bytes:
    """A completion body of `size` bytes (at least the fields' own length)."""
    head = json.dumps({"model": model, "max_tokens": 1, "prompt": ""}).encode()
    room = max(0, size - len(head))
    prompt = (FILLER * (room // len(FILLER) + 1))[:room]
    return head[:-2] + prompt.encode() + head[-2:]   # the prompt's text goes between its quotes


def send_big_body(url: str, body: bytes, headers: dict[str, str], timeout: float) -> BigBody:
    import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

    outcome = BigBody(len(body), sent=time.perf_counter())
    try:
        with httpx.Client(timeout=timeout) as http:
            response = http.post(url + "/v1/completions", content=body,
                                 headers={**headers, "Content-Type": "application/json"})
        outcome.status = response.status_code
        if response.status_code != 200:
            try:
                outcome.code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                outcome.code = None
    except httpx.HTTPError as err:
        outcome.error = f"{type(err).__name__}: {err}"
    outcome.answered = time.perf_counter()
    return outcome


def _figures(answers: list[HealthAnswer]) -> dict:
    seconds = [a.seconds for a in answers]
    return {"polls": len(seconds),
            "median_ms": statistics.median(seconds) * 1000 if seconds else None,
            "max_ms": max(seconds) * 1000 if seconds else None,
            "max_ms_less_poller_wait": max(a.server_seconds for a in answers) * 1000 if answers else None}


def probe_summary(answers: list[HealthAnswer], big: BigBody | None, started: float) -> dict:
    """`started`: the level's start (perf_counter); the slowest polls are placed from it."""
    good = [a for a in answers if a.status == 200]
    slowest = sorted(good, key=lambda a: a.seconds, reverse=True)[:SLOWEST]
    summary: dict = {"health": {**_figures(good), "failures": len(answers) - len(good),
                                "slowest": [[round(a.sent - started, 3), round(a.sent, 3), round(a.seconds * 1000, 1),
                                             round(a.poller_wait * 1000, 1)] for a in slowest]}}
    if big is not None:
        summary["big_body_sent_at_s"] = round(big.sent - started, 3)
        inside = [a for a in good if big.sent <= a.sent and a.sent + a.seconds <= big.answered]
        summary["health_during_big_body"] = _figures(inside)
        summary["big_body"] = {**asdict(big), "seconds": big.seconds}
        del summary["big_body"]["sent"], summary["big_body"]["answered"]
    return summary


if __name__ == "__main__":
    poll(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
