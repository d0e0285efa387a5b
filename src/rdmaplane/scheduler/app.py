"""The HTTP service kube-scheduler calls: `/filter`, `/prioritize`, plus health, readiness,
metrics and an explain endpoint. Every request is answered from the cache, never from the API
server; bad input gets a 4xx with a message, an unexpected fault a 503 (never a 500).

Until the cache has listed every kind once (API server not reached yet) the decision endpoints
answer 503: a blind answer ("no NodeResourceTopology published" for every node) would fail every
RDMA pod, while an error lets kube-scheduler's `ignorable: true` schedule without us.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from functools import partial
from itertools import compress
from operator import attrgetter, not_
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.requests import ClientDisconnect

from rdmaplane.config import SchedulerExtenderConfig
from rdmaplane.httpbody import BodyTooLarge, read_body
from rdmaplane.scheduler import jobaware as ja
from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler import wire
from rdmaplane.scheduler.cache import KINDS, REASON_PREFIX, ClusterCache
from rdmaplane.supervisor import Supervisor

log = logging.getLogger("rdmaplane.scheduler")
CLIENT_CLOSED = 499  # nginx's code for "client closed request": how such requests are counted

Watcher = Callable[[ClusterCache, Callable[[str], None]], Coroutine[Any, Any, None]]


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Metrics:
    def __init__(self, cache: ClusterCache) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rdmaplane_extender_requests_total",
            "Extender HTTP requests.",
            ["verb", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "rdmaplane_extender_request_duration_seconds",
            "Time to answer a scheduler call, from body read to reply.",
            ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.nodes = Counter(
            "rdmaplane_extender_filter_nodes_total",
            "Filter outcomes per node.",
            ["outcome"],
            registry=r,
        )
        self.restarts = Counter(
            "rdmaplane_extender_watch_restarts_total",
            "Watches restarted after an error.",
            ["kind"],
            registry=r,
        )
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        objects = Gauge(
            "rdmaplane_extender_cache_objects", "Objects in the cache.", ["kind"], registry=r
        )
        synced = Gauge(
            "rdmaplane_extender_cache_synced",
            "1 once a kind has been listed.",
            ["kind"],
            registry=r,
        )
        for kind in KINDS:
            objects.labels(kind).set_function(partial(_count, cache, kind))
            synced.labels(kind).set_function(partial(_synced, cache, kind))

    def count(self, verb: str, code: int, seconds: float) -> None:
        """One answered request (label lookups cached: they cost more than the rest here)."""
        children = self._children.get((verb, code))
        if children is None:
            children = (self.requests.labels(verb, str(code)), self.latency.labels(verb))
            self._children[verb, code] = children
        children[0].inc()
        children[1].observe(seconds)


_FITS = attrgetter("fits")
_SCORE = attrgetter("score")
_REASON = attrgetter("reason")
_UNRESOLVABLE = attrgetter("unresolvable")


@functools.lru_cache(maxsize=4096)
def _wire_reason(reason: str) -> str:
    return REASON_PREFIX + reason


def _count(cache: ClusterCache, kind: str) -> float:
    return float(cache.counts()[kind])


def _synced(cache: ClusterCache, kind: str) -> float:
    return float(cache.synced[kind])


def create_app(
    cache: ClusterCache, config: SchedulerExtenderConfig, watcher: Watcher | None = None
) -> FastAPI:
    metrics = Metrics(cache)

    tasks = Supervisor()  # a watch task that fails is restarted, /healthz fails meanwhile

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gc.freeze()  # what exists at startup (a pre-filled cache) is never garbage
        if watcher is not None:
            restarted = metrics.restarts.labels
            tasks.spawn("watch", lambda: watcher(cache, lambda kind: restarted(kind).inc()))
        yield
        await tasks.close()

    app = FastAPI(title="rdmaplane scheduler extender", lifespan=lifespan, openapi_url=None)
    app.state.metrics = metrics
    app.state.tasks = tasks

    async def handle(
        verb: str, request: Request, answer: Callable[[wire.ExtenderArgs], bytes]
    ) -> Response:
        start = time.perf_counter()
        try:
            try:
                body = await read_body(request, config.max_request_bytes)
            except BodyTooLarge as exc:
                raise _Reject(413, str(exc)) from None
            if not cache.ready:
                raise _Reject(503, f"cache not synced yet: {_unsynced(cache)}; ask again later")
            args = wire.parse_args(body)
            response = Response(answer(args), media_type="application/json")
            response.headers["Server-Timing"] = (
                f"app;dur={(time.perf_counter() - start) * 1000:.3f}"
            )
        except ClientDisconnect:  # nobody is left to answer; not our fault, not an error
            log.info("%s: the client went away before sending the whole request body", verb)
            response = Response(status_code=CLIENT_CLOSED)
        except _Reject as exc:
            response = _error(exc.status, str(exc))
            if exc.status == 413:  # the rest of the body may still be on its way: drop it
                response.headers["Connection"] = "close"
        except (wire.WireError, pl.RequestError) as exc:
            response = _error(400, str(exc))
        except Exception as exc:  # never a 500: say what broke, keep serving
            log.exception("%s failed", verb)
            response = _error(503, f"internal error: {type(exc).__name__}: {exc}")
        metrics.count(verb, response.status_code, time.perf_counter() - start)
        return response

    def decide(args: wire.ExtenderArgs) -> tuple[pl.PodRequest, Sequence[pl.Verdict]]:
        request = pl.pod_request(args.pod, cache.policy.names)
        return request, cache.verdicts(args.node_names, request)

    passed_nodes, failed_nodes, unresolvable_nodes = (
        metrics.nodes.labels(o) for o in ("passed", "failed", "unresolvable")
    )

    def do_filter(args: wire.ExtenderArgs) -> bytes:
        names = args.node_names
        _, found = decide(args)
        fits = list(map(_FITS, found))
        passed = list(compress(names, fits))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if len(passed) < len(names):  # C-level passes over the failures, no Python loop
            bad = list(map(not_, fits))
            bad_names, bad_verdicts = list(compress(names, bad)), list(compress(found, bad))
            final = list(map(_UNRESOLVABLE, bad_verdicts))
            for target, keep in ((unresolvable, final), (failed, list(map(not_, final)))):
                reasons = map(_wire_reason, map(_REASON, compress(bad_verdicts, keep)))
                target.update(zip(compress(bad_names, keep), reasons, strict=True))
        passed_nodes.inc(len(passed))
        failed_nodes.inc(len(failed))
        unresolvable_nodes.inc(len(unresolvable))
        return wire.filter_result(args, passed, failed, unresolvable)

    weights = config.fabric.weights()

    def score(
        args: wire.ExtenderArgs,
    ) -> tuple[pl.PodRequest, Sequence[pl.Verdict], list[int], list[float] | None]:
        request, found = decide(args)
        scores, terms = cache.job_scores(args.pod, args.node_names, request, found, weights)
        return request, found, scores, terms

    def do_prioritize(args: wire.ExtenderArgs) -> bytes:
        _, _, scores, _ = score(args)
        return wire.priorities(zip(args.node_names, scores, strict=True))

    def do_explain(args: wire.ExtenderArgs) -> bytes:
        request, found, scores, terms = score(args)
        rows = explain_rows(cache, list(zip(args.node_names, found, strict=True)), scores, terms)
        job = cache.job_context(args.pod)
        return orjson.dumps(
            {"request": explain_request(request), "job": explain_job(job), "nodes": rows}
        )

    @app.post("/filter")
    async def filter_(request: Request) -> Response:
        return await handle("filter", request, do_filter)

    @app.post("/prioritize")
    async def prioritize(request: Request) -> Response:
        return await handle("prioritize", request, do_prioritize)

    @app.post("/debug/explain")
    async def explain(request: Request) -> Response:
        return await handle("explain", request, do_explain)

    @app.get("/debug/nodes/{name}")
    async def node(name: str) -> Response:
        entry = cache.entry(name)
        if entry is None:
            return _error(404, f"no NodeResourceTopology cached for node {name!r}")
        body = {
            "name": name,
            "unaccountedPods": entry.unaccounted,
            "state": _state_dict(entry.state),
        }
        return Response(orjson.dumps(body), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        down = "".join(f"task {name} is down: {fault}\n" for name, fault in tasks.down.items())
        if down:
            return Response(down, status_code=503, media_type="text/plain")
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if cache.ready:
            return Response("ok\n", media_type="text/plain")
        return Response(
            f"cache not synced yet: {_unsynced(cache)}\n", status_code=503, media_type="text/plain"
        )

    @app.get("/metrics")
    async def metrics_() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _unsynced(cache: ClusterCache) -> str:
    return ", ".join(k for k, done in cache.synced.items() if not done)


def _error(status: int, message: str) -> Response:
    return Response(
        orjson.dumps({"Error": message}), status_code=status, media_type="application/json"
    )


def explain_request(request: pl.PodRequest) -> dict[str, Any]:
    return {
        "containers": request.containers,
        "initContainers": request.init,
        "total": request.total,
    }


def explain_job(job: ja.JobContext | None) -> dict[str, Any] | None:
    """What the extender knows of the pod's job: its bound peers and how many are left."""
    if job is None:
        return None
    return {
        "peerNodes": sorted(set(job.peer_nodes)),
        "boundPeers": len(job.peer_nodes),
        "remaining": job.remaining,
    }


def explain_rows(
    cache: ClusterCache,
    decided: list[tuple[str, pl.Verdict]],
    scores: Sequence[int] | None = None,
    terms: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """One row per node, best first; with job-aware scoring, the composed score and the
    fabric term beside the node-local score."""
    final = list(scores) if scores is not None else [v.score for _, v in decided]
    order = sorted(
        range(len(decided)), key=lambda i: (not decided[i][1].fits, -final[i], decided[i][0])
    )
    rows: list[dict[str, Any]] = []
    for i in order:
        name, v = decided[i]
        entry = cache.entry(name)
        place = cache.locations.get(name)
        row = {
            "node": name,
            "policy": f"{entry.state.policy}/{entry.state.scope}" if entry else "",
            "fits": v.fits,
            "unresolvable": v.unresolvable,
            "score": final[i],
            "nodeScore": v.score,
            "alignment": v.alignment,
            "detail": v.reason,
            "unaccountedPods": list(entry.unaccounted) if entry else [],
            "tiers": list(place.tiers) if place else [],
        }
        if terms is not None:
            row["fabricTerm"] = round(terms[i], 3)
        rows.append(row)
    return rows


def _state_dict(state: pl.NodeState) -> dict[str, Any]:
    return {
        "policy": state.policy,
        "scope": state.scope,
        "zones": [
            {
                "name": z.name,
                "capacity": z.capacity,
                "free": z.free,
                "roots": [
                    {
                        "name": r.name,
                        "gpus": r.gpus,
                        "hcas": r.hcas,
                        "freeGpus": r.free_gpus,
                        "freeHcas": r.free_hcas,
                        "poolHcas": r.pool_hcas,
                    }
                    for r in z.roots
                ],
            }
            for z in state.zones
        ],
    }
