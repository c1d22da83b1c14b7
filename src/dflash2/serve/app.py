"""The HTTP routes (FastAPI): an OpenAI-compatible API over the continuous-batching scheduler.

Contract: `create_app(pipeline, settings)` -> a FastAPI app whose lifespan starts and stops the
scheduler thread (`app.state.scheduler`, `app.state.metrics`).
- `POST /v1/chat/completions`, `POST /v1/completions`: parsed by `protocol`, encoded and checked
  by `jobs.build_job`, queued on the scheduler. Not streaming: one JSON body. Streaming
  (`"stream": true`): server-sent events in OpenAI's chunk format, a chunk per committed token
  whose text can be shown (chat: a first chunk with the role), a last chunk with
  `finish_reason`, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`. The
  response starts once the request has its first token, so a request that fails to start gets
  a plain HTTP error; an error after that is an `error` event. A client that goes away (stream
  closed, or a non-streaming request's connection dropped) frees its row at the next cycle.
- `GET /v1/models`, `GET /health` (200 `{"status": "ok"}` while the scheduler runs, else 503),
  `GET /metrics` (Prometheus text), `GET /` (the playground page) and `GET /playground.js`.
- With an API key (`--api-key` / `DFLASH2_API_KEY`), `/v1/*` needs `Authorization: Bearer KEY`
  (401 otherwise); `/health`, `/metrics` and the playground page are open.
- Every error is `protocol.ApiError`'s OpenAI-style body with its status (unknown routes 404,
  wrong methods 405, anything unexpected 500).
"""
from __future__ import annotations

import asyncio
import copy
import hmac
import html
import logging
import time
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dflash2.serve.jobs import Failed, Finished, Job, Progress, build_job
from dflash2.serve.metrics import CONTENT_TYPE, ServerMetrics
from dflash2.serve.protocol import ApiError, ApiRequest, bad_request, parse_chat, parse_completion, parse_json
from dflash2.serve.responses import DONE, Reply, sse, sse_error
from dflash2.serve.scheduler import Scheduler
from dflash2.serve.settings import ServeSettings

log = logging.getLogger("dflash2.serve")

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_POLL_S = 0.25   # how often a waiting request checks that its client is still there


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class _EventStream(StreamingResponse):
    """A StreamingResponse that always closes its generator (so its clean-up runs at once)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def _asset(name: str) -> str:
    return (resources.files("dflash2.serve") / name).read_text(encoding="utf-8")


def create_app(pipeline, settings: ServeSettings) -> FastAPI:
    served = settings.served_model
    metrics = ServerMetrics(served, pipeline.draft_description, pipeline.decoder.speculate)
    scheduler = Scheduler(pipeline.decoder, metrics, settings.max_batch, settings.max_queue, settings.retry_after_s)
    created = int(time.time())
    text_tokenizer = copy.deepcopy(pipeline.tokenizer)  # decodes in the scheduler thread; encoding stays here

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        scheduler.start()
        log.info("dflash2 serve: model %s, draft %s, speculate %s, max batch %d, max queue %d", served,
                 pipeline.draft_description, pipeline.decoder.speculate, settings.max_batch, settings.max_queue)
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="dflash2", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler, app.state.metrics, app.state.settings = scheduler, metrics, settings

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, err: StarletteHTTPException):
        message = "Unknown route." if err.status_code == 404 else str(err.detail)
        return error_response(ApiError(err.status_code, message, code=str(err.status_code)))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, err: Exception):
        log.exception("unexpected error")
        return error_response(ApiError(500, f"Internal server error: {type(err).__name__}: {err}"))

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), settings.api_key.encode()):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")

    async def next_item(request: Request, job: Job, channel: asyncio.Queue):
        """The job's next result; None when the client went away meanwhile. Either way, or when
        the handler is cancelled, a job nobody waits for any more is cancelled."""
        try:
            while True:
                try:
                    return await asyncio.wait_for(channel.get(), _POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        scheduler.cancel(job)
                        return None
        except asyncio.CancelledError:
            scheduler.cancel(job)
            raise

    async def generate(request: Request, endpoint: str) -> Response:
        try:
            authorize(request)
            body = parse_json(await request.body())
            api = parse_chat(body) if endpoint == CHAT else parse_completion(body)
            if api.model != served:
                raise bad_request(f"The model '{api.model}' does not exist: this server serves '{served}' "
                                  "(see GET /v1/models).", "model", "model_not_found")
            loop, channel = asyncio.get_running_loop(), asyncio.Queue()

            def sink(item) -> None:  # called from the scheduler thread
                try:
                    loop.call_soon_threadsafe(channel.put_nowait, item)
                except RuntimeError:  # the loop has closed: nobody is listening any more
                    pass

            job = build_job(api, pipeline, settings.defaults, sink, text_tokenizer)
            scheduler.submit(job)
        except ApiError as err:
            metrics.request(endpoint, err.status)
            return error_response(err)
        reply = Reply(job.id, api.kind, served, int(time.time()), api.return_token_ids)
        try:  # the first result decides the status: a stream starts only once the request has its first token
            item = await next_item(request, job, channel)
            if api.stream and isinstance(item, (Progress, Finished)):
                return _EventStream(stream(api, job, reply, channel, item, endpoint), media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            while item is not None and not isinstance(item, (Finished, Failed)):
                item = await next_item(request, job, channel)
        except asyncio.CancelledError:
            metrics.request(endpoint, 499)
            raise
        if item is None:
            status, response = 499, Response(status_code=499)
        elif isinstance(item, Failed):
            status, response = item.error.status, error_response(item.error)
        else:
            status, response = 200, JSONResponse(reply.complete(item))
        metrics.request(endpoint, status)
        return response

    async def stream(api: ApiRequest, job: Job, reply: Reply, channel: asyncio.Queue, item, endpoint: str):
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
            if status != 200:
                scheduler.cancel(job)
            metrics.request(endpoint, status)

    @app.post(CHAT)
    async def chat_completions(request: Request):
        return await generate(request, CHAT)

    @app.post(COMPLETIONS)
    async def completions(request: Request):
        return await generate(request, COMPLETIONS)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
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
