"""The HTTP edge: what every request passes through on its way in and out (pure ASGI middleware).

Contract: `Guard(app, metrics, max_body_bytes, endpoints)` wraps the routes (outside FastAPI's own
error handling, so nothing it lets through reaches the server):
- Body size: a request whose `Content-Length` exceeds `max_body_bytes` is answered 413 at once,
  before any of it is read (the server discards the rest and the keep-alive connection stays
  usable; over `CLOSE_ABOVE_BYTES` the 413 closes the connection); a body without a length is
  counted as it arrives and the read that crosses the limit raises `ApiError` 413 in the route.
- Faults: an exception that escapes the routes is logged once, with its traceback, and answered
  500 (OpenAI's error body) when no response has started, or the started response is ended
  cleanly: the connection is never reset. A request cancelled by the server (a drain cut) ends
  with one log line, no traceback.
- Metrics: every response is counted once in `dflash2_requests_total{endpoint, status}` (unknown
  paths as endpoint "other"): the status a route recorded with `record_status` (a stream's final
  status, sent after its 200 head) or else the status sent (499 when the client left before
  any response).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from dflash2.serve.metrics import ServerMetrics
from dflash2.serve.protocol import ApiError

log = logging.getLogger("dflash2.serve")

CLOSE_ABOVE_BYTES = 64 * 2**20   # a declared body this large is not worth discarding: close after the 413
_OUTCOME = "dflash2.outcome"     # the scope key of a request's `_Outcome`


@dataclass
class _Outcome:
    sent: int | None = None          # the status of the response head sent
    final: int | None = None         # the status a route recorded (streams)
    complete: bool = False           # the last body chunk was sent


def record_status(scope: dict, status: int) -> None:
    """Record the status a request ended with when it differs from its response head (a stream)."""
    if _OUTCOME in scope:
        scope[_OUTCOME].final = status


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this server's limit of {limit} bytes "
                         f"({limit / 2**20:g} MiB, --max-request-mb).", code="request_too_large")


def internal_error(err: Exception) -> ApiError:
    """The 500 for an unexpected exception: its type and the first line of its message."""
    first = str(err).splitlines()[0] if str(err) else ""
    return ApiError(500, f"Internal server error: {type(err).__name__}: {first}")


def _content_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class Guard:
    def __init__(self, app, metrics: ServerMetrics, max_body_bytes: int, endpoints: set[str]):
        self.app, self.metrics, self.max_body_bytes, self.endpoints = app, metrics, max_body_bytes, endpoints

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome = scope[_OUTCOME] = _Outcome()
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        limit, seen = self.max_body_bytes, 0

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit)
            return message

        async def watched_send(message) -> None:
            if message["type"] == "http.response.start":
                outcome.sent = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                outcome.complete = True
            await send(message)

        try:
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                await self._reply(watched_send, too_large(limit), close=declared > CLOSE_ABOVE_BYTES)
            else:
                await self.app(scope, counted_receive, watched_send)
        except asyncio.CancelledError:
            log.warning("%s %s cut by the server shutting down", scope["method"], scope["path"])
            await self._end(outcome, watched_send, None)
        except Exception as err:  # noqa: BLE001 - the last line of defence: log it, answer 500, keep the connection
            log.exception("unexpected error in %s %s", scope["method"], scope["path"])
            await self._end(outcome, watched_send, err)
        finally:
            status = outcome.final or outcome.sent or 499
            self.metrics.request(endpoint, status)

    async def _reply(self, send, error: ApiError, close: bool = False) -> None:
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _end(self, outcome: _Outcome, send, err: Exception | None) -> None:
        """Finish the response a failed or cancelled request left: a 500 if none started, else
        its last (empty) chunk; nothing if it is already complete or the client is gone."""
        try:
            if outcome.sent is None and err is not None:
                await self._reply(send, internal_error(err))
            elif outcome.sent is not None and not outcome.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # noqa: BLE001 - the client went away meanwhile: nothing left to tell it
            pass
