"""The HTTP service kube-scheduler calls: `/filter`, `/prioritize`, plus health, readiness,
metrics and an explain endpoint. Every request is answered from the cache, never from the API
server; bad input gets a 4xx with a message, an unexpected fault a 503 (never a 500).

Until the cache has listed every kind once (API server not reached yet) the decision endpoints
answer 503: a blind answer ("no NodeResourceTopology published" for every node) would fail every
RDMA pod, while an error lets kube-scheduler's `ignorable: true` schedule without us.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import orjson
from fastapi import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from rdmaplane.adapters.httpbody import BodyTooLarge, read_asgi_body
from rdmaplane.services.scheduler.cache import KINDS, REASON_PREFIX, ClusterCache
from rdmaplane.services.scheduler.decisions import Decisions
from rdmaplane.services.scheduler.policy import nodestate, podrequest, wire
from rdmaplane.services.scheduler.serving import Answer, DirectCalls

log = logging.getLogger("rdmaplane.services.scheduler")
CLIENT_CLOSED = 499  # nginx's code for "client closed request": how such requests are counted

Watcher = Callable[[ClusterCache, Callable[[str], None]], Coroutine[Any, Any, None]]


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ExtenderMetrics:
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


@functools.lru_cache(maxsize=4096)
def _wire_reason(reason: str) -> str:
    return REASON_PREFIX + reason


def _count(cache: ClusterCache, kind: str) -> float:
    return float(cache.counts()[kind])


def _synced(cache: ClusterCache, kind: str) -> float:
    return float(cache.synced[kind])


class ExtenderShell:
    """The extender's transport: it parses what kube-scheduler sends, serialises what the
    decider (`Decisions`) answers, maps faults to HTTP codes and counts requests. No decision
    is made here."""

    def __init__(self, cache: ClusterCache, decide: Decisions, metrics: ExtenderMetrics) -> None:
        self.cache = cache
        self.decide = decide
        self.metrics = metrics
        self._outcomes = [metrics.nodes.labels(o) for o in ("passed", "failed", "unresolvable")]
        self.decisions: dict[str, tuple[str, Callable[[wire.ExtenderArgs], bytes]]] = {
            "/filter": ("filter", self.filter),
            "/prioritize": ("prioritize", self.prioritize),
            "/debug/explain": ("explain", self.explain),
        }

    async def handle(
        self,
        verb: str,
        read: Callable[[], Awaitable[bytes]],
        answer: Callable[[wire.ExtenderArgs], bytes],
    ) -> Answer:
        """One decision call through ASGI: the body read, then `answer_body`."""
        start = time.perf_counter()
        try:
            body = await read()
        except BodyTooLarge as exc:  # the rest of the body may still be on its way: drop it
            return self._answered(verb, start, 413, _error_body(str(exc)), {"Connection": "close"})
        except ClientDisconnect:
            self._abandoned(verb, time.perf_counter() - start)
            return CLIENT_CLOSED, b"", {}
        return self.answer_body(verb, answer, body, start)

    def _abandoned(self, verb: str, seconds: float) -> None:
        """Nobody is left to answer: not our fault, not an error."""
        log.info("%s: the client went away before sending the whole request body", verb)
        self.metrics.count(verb, CLIENT_CLOSED, seconds)

    def answer_body(
        self,
        verb: str,
        answer: Callable[[wire.ExtenderArgs], bytes],
        body: bytes,
        start: float | None = None,
    ) -> Answer:
        """One decision call, whatever serves it: (status, JSON body, extra headers). Never
        raises: bad input is a 400, an unready cache or a fault of ours a 503."""
        start = time.perf_counter() if start is None else start
        headers: dict[str, str] = {}
        try:
            if not self.cache.ready:
                unsynced = _unsynced(self.cache)
                raise _Reject(503, f"cache not synced yet: {unsynced}; ask again later")
            args = wire.parse_args(body)
            status, content = 200, answer(args)
            headers["Server-Timing"] = f"app;dur={(time.perf_counter() - start) * 1000:.3f}"
        except _Reject as exc:
            status, content = exc.status, _error_body(str(exc))
        except (wire.WireError, podrequest.RequestError) as exc:
            status, content = 400, _error_body(str(exc))
        except Exception as exc:  # never a 500: say what broke, keep serving
            log.exception("%s failed", verb)
            status, content = 503, _error_body(f"internal error: {type(exc).__name__}: {exc}")
        return self._answered(verb, start, status, content, headers)

    def _answered(
        self, verb: str, start: float, status: int, content: bytes, headers: dict[str, str]
    ) -> Answer:
        self.metrics.count(verb, status, time.perf_counter() - start)
        return status, content, headers

    def direct_calls(self, limit: int) -> DirectCalls:
        """kube-scheduler's two calls as the HTTP protocol answers them itself
        (`serving.DirectCallsProtocol`): path → the answer to a whole body."""
        routes = {p: self.decisions[p] for p in SCHEDULER_PATHS}
        return DirectCalls(
            {path: partial(self.answer_body, verb, fn) for path, (verb, fn) in routes.items()},
            limit,
            lambda path, seconds: self._abandoned(routes[path][0], seconds),
        )

    def filter(self, args: wire.ExtenderArgs) -> bytes:
        found = self.decide.filter(args.pod, args.node_names)
        failed = dict(zip(found.failed, map(_wire_reason, found.failed.values()), strict=True))
        unresolvable = dict(
            zip(found.unresolvable, map(_wire_reason, found.unresolvable.values()), strict=True)
        )
        passed_nodes, failed_nodes, unresolvable_nodes = self._outcomes
        passed_nodes.inc(len(found.passed))
        failed_nodes.inc(len(failed))
        unresolvable_nodes.inc(len(unresolvable))
        return wire.filter_result(args, found.passed, failed, unresolvable)

    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        scored = self.decide.answer_prioritize(args.pod, args.node_names)
        return wire.priorities(args.node_names, scored.scores)

    def explain(self, args: wire.ExtenderArgs) -> bytes:
        return orjson.dumps(self.decide.explain(args.pod, args.node_names))

    def node(self, name: str) -> Response:
        """`/debug/nodes/{name}`: the cached state of one node."""
        entry = self.cache.entry(name)
        if entry is None:
            return _error(404, f"no NodeResourceTopology cached for node {name!r}")
        body = {
            "name": name,
            "unaccountedPods": entry.unaccounted,
            "state": _state_dict(entry.state),
        }
        return Response(orjson.dumps(body), media_type="application/json")

    def readyz(self) -> Response:
        if self.cache.ready:
            return Response("ok\n", media_type="text/plain")
        return Response(
            f"cache not synced yet: {_unsynced(self.cache)}\n",
            status_code=503,
            media_type="text/plain",
        )

    def metrics_page(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _unsynced(cache: ClusterCache) -> str:
    return ", ".join(k for k, done in cache.synced.items() if not done)


def _error_body(message: str) -> bytes:
    return orjson.dumps({"Error": message})


def _error(status: int, message: str) -> Response:
    return Response(_error_body(message), status_code=status, media_type="application/json")


_JSON = (b"content-type", b"application/json")


SCHEDULER_PATHS = ("/filter", "/prioritize")


class DecisionRoutes:
    """POST /filter, /prioritize (and /debug/explain) as plain ASGI, in front of the FastAPI
    app: kube-scheduler
    waits on both in every scheduling cycle, and FastAPI's routing, dependency solving and
    middleware cost more than the decision itself (about half the request's CPU, measured in
    bench/cluster.py). Everything else goes on to the app. `paths` keeps some of them."""

    def __init__(
        self, app: ASGIApp, shell: ExtenderShell, limit: int, paths: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.decisions = {p: r for p, r in shell.decisions.items() if not paths or p in paths}
        self.handle = shell.handle
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.decisions.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        verb, answer = route
        status, content, headers = await self.handle(
            verb, lambda: read_asgi_body(scope, receive, self.limit), answer
        )
        if status == CLIENT_CLOSED:
            return  # nobody to send it to
        raw = [_JSON, (b"content-length", str(len(content)).encode())]
        raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})


def _state_dict(state: nodestate.NodeState) -> dict[str, Any]:
    """A node state for people, every count by resource name."""
    v = state.vocabulary
    return {
        "policy": state.policy,
        "scope": state.scope,
        "resources": {"gpus": v.gpus, "exclusive": v.exclusive, "shared": v.shared},
        "zones": [
            {
                "name": z.name,
                "capacity": dict(z.capacity),
                "free": dict(z.free),
                "poolHcas": dict(z.pool_hcas),
                "roots": [
                    {
                        "name": r.name,
                        "devices": dict(r.devices),
                        "free": dict(r.free),
                        "poolHcas": dict(r.pool_hcas),
                    }
                    for r in z.roots
                ],
            }
            for z in state.zones
        ],
    }
