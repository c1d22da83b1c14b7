"""The HTTP server process around the app: uvicorn, with a drain the app takes part in.

Contract: `make_server(pipeline, settings)` -> a `DrainingServer` (a `uvicorn.Server`) serving
`app.create_app(pipeline, settings)`. On SIGINT / SIGTERM it stops accepting connections and
tells the app its drain has started (`app.state.open_requests.drain()`): the requests in flight
may finish for `settings.drain_timeout_s`; then the app ends those still open itself (a 503, in a
stream an `error` event and `data: [DONE]`), and uvicorn's own cut of whatever is left comes
`DRAIN_GRACE_S` later.
"""
from __future__ import annotations

import math

import uvicorn

from dflash2.serve.app import create_app
from dflash2.serve.settings import ServeSettings

DRAIN_GRACE_S = 5.0   # after the drain timeout: time for the cut requests to send their error and close


class DrainingServer(uvicorn.Server):
    async def shutdown(self, sockets=None) -> None:
        self.config.app.state.open_requests.drain()
        await super().shutdown(sockets)


def make_server(pipeline, settings: ServeSettings) -> DrainingServer:
    config = uvicorn.Config(create_app(pipeline, settings), log_level=settings.log_level,
                            access_log=settings.access_log, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s + DRAIN_GRACE_S))
    return DrainingServer(config)
