"""`dflash2 serve`: an OpenAI-compatible HTTP server over the batched speculative decoder.

One concept per module:
- `settings`: `ServeSettings` / `RequestDefaults`, checked before anything is loaded.
- `protocol`: request bodies -> typed `ApiRequest`; `ApiError` with OpenAI-style error bodies.
- `jobs`: a request as the scheduler sees it (prompt ids, `GenerationConfig`), and its results.
- `text`: incremental detokenization and stop strings across token boundaries.
- `scheduler`: the continuous-batching thread that drives the `DecodeSession`.
- `responses`: response bodies, stream chunks, server-sent events.
- `metrics`: Prometheus metrics.
- `guard`: the HTTP edge every request passes (body-size limit, faults answered without a reset,
  every status counted).
- `generation`: the generation routes (body -> job in encoder threads -> response or stream; the
  drain cut).
- `app`: the FastAPI routes; `playground.html` / `playground.js`: the page at `/`.
- `server`: uvicorn around the app, with the drain the app takes part in.
- `command`: `dflash2 serve` (arguments, model loading, uvicorn). The load test (`dflash2 loadtest`)
  and the headless playground driver live in `dflash2.tools`.
"""
