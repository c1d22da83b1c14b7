"""`dflash2 serve`: an OpenAI-compatible HTTP server over the batched speculative decoder.

One concept per module:
- `settings`: `ServeSettings` / `RequestDefaults`, checked before anything is loaded.
- `protocol`: request bodies -> typed `ApiRequest`; `ApiError` with OpenAI-style error bodies.
- `jobs`: a request as the scheduler sees it (prompt ids, `GenerationConfig`), and its results.
- `text`: incremental detokenization and stop strings across token boundaries.
- `scheduler`: the continuous-batching thread that drives the `DecodeSession`.
- `responses`: response bodies, stream chunks, server-sent events.
- `metrics`: Prometheus metrics.
- `app`: the FastAPI routes; `playground.html` / `playground.js`: the page at `/`.
- `command`: `dflash2 serve` (arguments, model loading, uvicorn). The load test (`dflash2 loadtest`)
  and the headless playground driver live in `dflash2.tools`.
"""
