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
- `cli`: `dflash2 serve`; `loadtest`: `dflash2 loadtest`; `browser`: headless Chromium driving
  the playground (tests, the docs screenshot).
"""
