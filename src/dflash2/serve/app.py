"""The HTTP routes (FastAPI): an OpenAI-compatible API over the continuous-batching scheduler.

Contract: `create_app(pipeline, settings)` -> a FastAPI app whose lifespan starts and stops the
scheduler thread (`app.state.scheduler`, `app.state.metrics`, `app.state.open_requests`: call its
`drain()` when the server starts to shut down). Every request passes `guard.Guard` (the body-size
limit, 413; faults answered 500 without resetting the connection; every status counted).
- `POST /v1/chat/completions`, `POST /v1/completions` (`generation`): parsed by `protocol`,
  encoded and checked by `jobs.build_job` in an encoder thread (never on the event loop), queued
  on the scheduler. Not streaming: one JSON body. Streaming
  (`"stream": true`): server-sent events in OpenAI's chunk format, a chunk per committed token
  whose text can be shown (chat: a first chunk with the role), a last chunk with
  `finish_reason`, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`. The
  response starts once the request has its first token, so a request that fails to start gets
  a plain HTTP error; an error after that is an `error` event. A client that goes away (stream
  closed, or a non-streaming request's connection dropped) frees its row at the next cycle.
- `POST /tokenize` (vLLM's: a text's token ids; behind the API key like `/v1/*`), `GET /v1/models`,
  `GET /health` (200 `{"status": "ok"}` while the scheduler runs, else 503),
  `GET /metrics` (Prometheus text), `GET /` (the playground page) and `GET /playground.js`.
- With an API key (`--api-key` / `DFLASH2_API_KEY`), `/v1/*` and `/tokenize` need `Authorization: Bearer KEY`
  (401 otherwise); `/health`, `/metrics` and the playground page are open.
- Every error is `protocol.ApiError`'s OpenAI-style body with its status (malformed bodies 400,
  unknown routes 404, wrong methods 405, bodies over the limit 413, anything unexpected 500).
"""
from __future__ import annotations

import html
import logging
import os
import time
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.serve.generation import CHAT, COMPLETIONS, Encoders, Generation, OpenRequests, error_response
from dflash2.serve.guard import Guard, internal_error
from dflash2.serve.metrics import CONTENT_TYPE, ServerMetrics
from dflash2.serve.protocol import ApiError
from dflash2.serve.scheduler import Scheduler
from dflash2.serve.settings import ServeSettings

log = logging.getLogger("dflash2.serve")

ENCODE_WORKERS = min(4, os.cpu_count() or 1)   # threads turning request bodies into jobs


def _asset(name: str) -> str:
    return (resources.files("dflash2.serve") / name).read_text(encoding="utf-8")


class _GuardedApp(FastAPI):
    """FastAPI with `guard.Guard` outside all of its own middleware (its error handling included)."""

    guard_settings: tuple[ServerMetrics, int] | None = None

    def build_middleware_stack(self):
        metrics, max_body_bytes = self.guard_settings
        return Guard(super().build_middleware_stack(), metrics, max_body_bytes,
                     {route.path for route in self.routes})


def create_app(pipeline, settings: ServeSettings) -> FastAPI:
    served = settings.served_model
    metrics = ServerMetrics(served, pipeline.draft_description, pipeline.decoder.speculate,
                            max(pipeline.decoder.block_size(GenerationConfig()) - 1, 0))
    scheduler = Scheduler(pipeline.decoder, metrics, settings.max_batch, settings.max_queue, settings.retry_after_s)
    encoders = Encoders(pipeline.tokenizer, ENCODE_WORKERS)
    open_requests = OpenRequests(settings.drain_timeout_s)
    generation = Generation(pipeline, settings, scheduler, encoders, open_requests)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        scheduler.start()
        log.info("dflash2 serve: model %s, draft %s, speculate %s, max batch %d, max queue %d", served,
                 pipeline.draft_description, pipeline.decoder.speculate, settings.max_batch, settings.max_queue)
        try:
            yield
        finally:
            scheduler.stop()
            encoders.close()

    app = _GuardedApp(title="dflash2", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.guard_settings = (metrics, settings.max_request_bytes)
    app.state.scheduler, app.state.metrics, app.state.settings = scheduler, metrics, settings
    app.state.open_requests = open_requests

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, err: StarletteHTTPException):
        message = "Unknown route." if err.status_code == 404 else str(err.detail)
        return error_response(ApiError(err.status_code, message, code=str(err.status_code)))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, err: Exception):  # logged by the Guard, which it reaches next
        return error_response(internal_error(err))

    @app.post(CHAT)
    async def chat_completions(request: Request):
        return await generation.handle(request, CHAT)

    @app.post(COMPLETIONS)
    async def completions(request: Request):
        return await generation.handle(request, COMPLETIONS)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await generation.tokenize(request)

    @app.get("/v1/models")
    async def models(request: Request):
        generation.authorize(request)
        return {"object": "list", "data": [{"id": served, "object": "model", "created": created,
                                            "owned_by": "dflash2"}]}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if scheduler.alive else "unavailable", "running": scheduler.running,
                "queued": scheduler.queue_depth}
        return JSONResponse(body, status_code=200 if scheduler.alive else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        page = _asset("playground.html")
        for name, value in (("MODEL", served), ("DRAFT", pipeline.draft_description),
                            ("SPECULATE", pipeline.decoder.speculate), ("AUTH", "yes" if settings.api_key else "no")):
            page = page.replace("{{" + name + "}}", html.escape(value))
        return HTMLResponse(page)

    @app.get("/playground.js")
    async def playground_js():
        return Response(_asset("playground.js"), media_type="text/javascript")

    return app
