"""The extender's composition root: the watch-fed cache, the decider over it, the HTTP shell in
front of it and the routes, as one FastAPI app (`rdmaplane scheduler-extender` serves it)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from functools import partial

from fastapi import FastAPI, Response
from starlette.types import ASGIApp

from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.decisions import Decisions
from rdmaplane.services.scheduler.http import (
    SCHEDULER_PATHS,
    DecisionRoutes,
    ExtenderMetrics,
    ExtenderShell,
    Watcher,
)


def create_app(
    cache: ClusterCache, config: ExtenderSettings, watcher: Watcher | None = None
) -> FastAPI:
    """The extender's composition root: the cache's watch under a supervisor, the decider
    over the cache, the shell in front of it, the routes."""
    metrics = ExtenderMetrics(cache)
    tasks = Supervisor()  # a watch task that fails is restarted, /healthz fails meanwhile
    shell = ExtenderShell(cache, Decisions(cache, config.fabric), metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gc.freeze()  # what exists at startup (a pre-filled cache) is never garbage
        if watcher is not None:
            restarted = metrics.restarts.labels
            tasks.spawn("watch", lambda: watcher(cache, lambda kind: restarted(kind).inc()))
        yield
        await tasks.close()

    app = FastAPI(title="rdmaplane scheduler extender", lifespan=lifespan, openapi_url=None)
    app.state.tasks = tasks  # its backoffs are the tests' to shorten
    app.state.direct_calls = shell.direct_calls(config.max_request_bytes)
    app.state.scheduler_calls = partial(
        DecisionRoutes, shell=shell, limit=config.max_request_bytes, paths=SCHEDULER_PATHS
    )
    app.add_middleware(DecisionRoutes, shell=shell, limit=config.max_request_bytes)

    @app.get("/debug/nodes/{name}")
    async def node(name: str) -> Response:
        return shell.node(name)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _healthz(tasks)

    @app.get("/readyz")
    async def readyz() -> Response:
        return shell.readyz()

    @app.get("/metrics")
    async def metrics_page() -> Response:
        return shell.metrics_page()

    return app


def scheduler_calls_first(app: FastAPI, outer: ASGIApp) -> ASGIApp:
    """`outer` (the app, wrapped) with kube-scheduler's calls answered before it: /filter and
    /prioritize skip the layers in front of the app too (FastAPI's own middleware and
    whatever wraps it: `LoopbackDebug`, which they are not subject to), two calls per pod."""
    make: Callable[[ASGIApp], ASGIApp] = app.state.scheduler_calls
    return make(outer)


def _healthz(tasks: Supervisor) -> Response:
    down = "".join(f"task {name} is down: {fault}\n" for name, fault in tasks.down.items())
    if down:
        return Response(down, status_code=503, media_type="text/plain")
    return Response("ok\n", media_type="text/plain")
