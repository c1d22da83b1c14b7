"""The load test's probe: one large request sent in the middle of a level, and `/health` polled
beside the streams, so that what one request costs everyone else is measured.

Contract:
- `Probe(big_body_bytes, health_every_s)`: the scenario of one level. `big_body_bytes` > 0: once
  every stream of the level has its first token, one completion request whose body is that many
  bytes (a prompt of "hello world " repeated, `max_tokens` 1) is sent on its own connection;
  `health_every_s` > 0: `GET /health` is polled at that interval on its own keep-alive connection
  from the level's start to its end.
- `HealthPoller(url, every_s)`: that poller, in its own thread (its timing is not the clients'
  event loop): `start()`, then `stop()` -> the `HealthAnswer`s (when sent, round trip, status; a
  failed poll is status 0).
- `big_body(model, size)` -> the request body, built before the level starts (building 20 MB of
  JSON during the level would stall the client, not the server).
- `send_big_body(url, body, headers, timeout)` -> `BigBody` (status, error code, when sent and
  answered): blocking, run in a thread.
- `probe_summary(answers, big)` -> the row's `probe` figures: polls, failures, median and max
  round trip over the whole level and while the big request was in flight.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass

FILLER = "hello world "


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
    def __init__(self, url: str, every_s: float, timeout_s: float = 30.0):
        self.url, self.every_s, self.timeout_s = url, every_s, timeout_s
        self.answers: list[HealthAnswer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="loadtest-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[HealthAnswer]:
        self._stop.set()
        self._thread.join()
        return self.answers

    def _poll(self) -> None:
        import httpx   # an optional dependency (the `test` extra): needed only when requests are sent

        with httpx.Client(timeout=self.timeout_s) as http:
            while not self._stop.is_set():
                sent = time.perf_counter()
                try:
                    status = http.get(self.url + "/health").status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append(HealthAnswer(sent, time.perf_counter() - sent, status))
                self._stop.wait(self.every_s)


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


def _figures(seconds: list[float]) -> dict:
    return {"polls": len(seconds),
            "median_ms": statistics.median(seconds) * 1000 if seconds else None,
            "max_ms": max(seconds) * 1000 if seconds else None}


def probe_summary(answers: list[HealthAnswer], big: BigBody | None) -> dict:
    good = [a for a in answers if a.status == 200]
    summary: dict = {"health": {**_figures([a.seconds for a in good]), "failures": len(answers) - len(good)}}
    if big is not None:
        inside = [a.seconds for a in good if big.sent <= a.sent and a.sent + a.seconds <= big.answered]
        summary["health_during_big_body"] = _figures(inside)
        summary["big_body"] = {**asdict(big), "seconds": big.seconds}
        del summary["big_body"]["sent"], summary["big_body"]["answered"]
    return summary

