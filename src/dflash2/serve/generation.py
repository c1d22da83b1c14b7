"""The two generation routes: a request body becomes a job off the event loop, and the job's
results become one JSON response or a server-sent event stream.

Contract:
- `Encoders(tokenizer, workers)`: a small thread pool; everything a body costs before it is queued
  (JSON parsing, the field checks, chat templating, tokenisation, the engine's checks) runs there,
  each thread with its own copy of the tokenizer (made when the server starts, not when a request
  starts a thread), so one large request never stalls the event loop (`/health`, the other
  streams). `close()` ends the threads.
- `OpenRequests(timeout_s)`: the requests waiting for results. `drain()` (the server began to
  shut down) starts the drain clock; when `timeout_s` runs out every request still open gets a
  503 `shutting_down` result: a waiting request answers it as its response, a stream sends it as
  an `error` event and `data: [DONE]` before the server closes the connection.
- `Generation.tokenize(request)`: `POST /tokenize` as vLLM answers it (`{"count", "max_model_len",
  "tokens"}`), encoded in an encoder thread; a tokenizer fingerprint for clients (`dflash2
  regenerate --endpoint` compares it with its own tokenizer).
- `Generation(pipeline, settings, scheduler, encoders, open_requests).handle(request, endpoint)`:
  authorises, reads the body, builds and queues the job, then answers (see `app` for the wire
  behaviour). The final status of a stream (200 only when it ran to its end; 499 when the client
  left) is recorded for the metrics with `guard.record_status`.
"""
from __future__ import annotations

import asyncio
import copy
import hmac
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from dflash2.serve.guard import record_status
from dflash2.serve.jobs import Failed, Finished, Job, Progress, build_job
from dflash2.serve.protocol import (ApiError, ApiRequest, bad_request, parse_chat, parse_completion, parse_json,
                                   parse_tokenize)
from dflash2.serve.responses import DONE, Reply, sse, sse_error
from dflash2.serve.scheduler import Scheduler
from dflash2.serve.settings import ServeSettings

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_POLL_S = 0.25   # how often a waiting request checks that its client is still there


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class Encoders:
    def __init__(self, tokenizer, workers: int):
        # the copies are made here, at start-up: copying a Rust-backed tokenizer is one call that
        # holds the GIL for a few hundred ms, which in a request's path would stall the event loop
        self._copies = queue.SimpleQueue()
        for _ in range(workers):
            self._copies.put(copy.deepcopy(tokenizer))
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dflash2-encode", initializer=self._own_copy)

    def _own_copy(self) -> None:
        self._local.tokenizer = self._copies.get_nowait()

    @property
    def tokenizer(self):
        """This worker thread's tokenizer."""
        return self._local.tokenizer

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class OpenRequests:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._channels: set[asyncio.Queue] = set()
        self._cut = False

    def open(self, channel: asyncio.Queue) -> None:
        self._channels.add(channel)
        if self._cut:
            channel.put_nowait(self._cut_result())

    def close(self, channel: asyncio.Queue) -> None:
        self._channels.discard(channel)

    def drain(self) -> None:
        asyncio.get_running_loop().call_later(self.timeout_s, self._cut_all)

    def _cut_result(self) -> Failed:
        return Failed(ApiError(503, f"The server is shutting down and its drain timeout ({self.timeout_s:g} s, "
                                    "--drain-timeout) ran out before this request finished.", code="shutting_down"))

    def _cut_all(self) -> None:
        self._cut = True
        for channel in self._channels:
            channel.put_nowait(self._cut_result())


class _EventStream(StreamingResponse):
    """A StreamingResponse that always closes its generator (so its clean-up runs at once)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


class Generation:
    def __init__(self, pipeline, settings: ServeSettings, scheduler: Scheduler, encoders: Encoders,
                 open_requests: OpenRequests):
        self.pipeline, self.settings, self.scheduler = pipeline, settings, scheduler
        self.encoders, self.open_requests = encoders, open_requests
        self.text_tokenizer = copy.deepcopy(pipeline.tokenizer)  # decodes in the scheduler thread

    def authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")

    def _check_model(self, model: str) -> None:
        served = self.settings.served_model
        if model != served:
            raise bad_request(f"The model '{model}' does not exist: this server serves '{served}' "
                              "(see GET /v1/models).", "model", "model_not_found")

    def _tokenize(self, raw: bytes) -> dict:
        body = parse_json(raw)
        text, add_special_tokens = parse_tokenize(body)
        if "model" in body:
            self._check_model(body["model"])
        ids = list(self.encoders.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        return {"count": len(ids), "max_model_len": self.pipeline.decoder.target.max_positions, "tokens": ids}

    async def tokenize(self, request: Request) -> Response:
        try:
            self.authorize(request)
            return JSONResponse(await self.encoders.run(self._tokenize, await request.body()))
        except ApiError as err:
            return error_response(err)
        except ClientDisconnect:
            return Response(status_code=499)

    def _prepare(self, raw: bytes, endpoint: str, sink) -> Job:
        """Body -> queued-ready job (an encoder thread)."""
        body = parse_json(raw)
        api = parse_chat(body) if endpoint == CHAT else parse_completion(body)
        self._check_model(api.model)
        return build_job(api, self.pipeline, self.settings.defaults, sink, self.text_tokenizer,
                         tokenizer=self.encoders.tokenizer)

    async def handle(self, request: Request, endpoint: str) -> Response:
        loop, channel = asyncio.get_running_loop(), asyncio.Queue()

        def sink(item) -> None:  # called from the scheduler thread
            try:
                loop.call_soon_threadsafe(channel.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is listening any more
                pass

        try:
            self.authorize(request)
            job = await self.encoders.run(self._prepare, await request.body(), endpoint, sink)
            self.scheduler.submit(job)
        except ApiError as err:
            return error_response(err)
        except ClientDisconnect:   # the client left before its body arrived: nobody to answer, no fault
            return Response(status_code=499)
        self.open_requests.open(channel)
        try:
            return await self._answer(request, job, channel)
        finally:
            self.open_requests.close(channel)

    async def _answer(self, request: Request, job: Job, channel: asyncio.Queue) -> Response:
        api = job.request
        reply = Reply(job.id, api.kind, self.settings.served_model, int(time.time()), api.return_token_ids,
                      self.settings.per_request_spec_decode_metrics)
        item = await self._next(request, job, channel)  # the first result decides the status
        if api.stream and isinstance(item, (Progress, Finished)):
            return _EventStream(self._stream(request, api, job, reply, channel, item), media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        while item is not None and not isinstance(item, (Finished, Failed)):
            item = await self._next(request, job, channel)
        if isinstance(item, Finished):
            return JSONResponse(reply.complete(item))
        self.scheduler.cancel(job)
        return Response(status_code=499) if item is None else error_response(item.error)

    async def _next(self, request: Request, job: Job, channel: asyncio.Queue):
        """The job's next result; None when the client went away meanwhile. Either way, or when
        the handler is cancelled, a job nobody waits for any more is cancelled."""
        try:
            while True:
                try:
                    return await asyncio.wait_for(channel.get(), _POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        self.scheduler.cancel(job)
                        return None
        except asyncio.CancelledError:
            self.scheduler.cancel(job)
            raise

    async def _stream(self, request: Request, api: ApiRequest, job: Job, reply: Reply, channel: asyncio.Queue,
                      item):
        self.open_requests.open(channel)   # the stream outlives the handler that opened the request
        status, sent = 499, 0
        ids: list[int] = []
        origins: list[str] = []
        try:
            head = reply.first_chunk()
            if head is not None:
                yield sse(head)
            while True:
                if isinstance(item, Progress):
                    for piece in item.pieces:
                        ids.append(piece.token_id)
                        origins.append(piece.origin)
                        if piece.text:   # tokens whose text is held back ride along with the next text
                            yield sse(reply.chunk(piece.text, ids, origins))
                            sent += len(piece.text)
                            ids, origins = [], []
                elif isinstance(item, Finished):
                    yield sse(reply.final_chunk(item.reason, item.text[sent:], ids, origins))
                    if api.include_usage:
                        yield sse(reply.usage_chunk(item))
                    yield DONE
                    status = 200
                    return
                else:
                    status = item.error.status
                    yield sse_error(item.error)
                    yield DONE
                    return
                item = await channel.get()
        finally:
            self.open_requests.close(channel)
            if status != 200:
                self.scheduler.cancel(job)
            record_status(request.scope, status)
