"""Extender latency through real HTTP: filter + prioritize at 1,000 and 5,000 nodes.

The server (uvicorn on loopback, in its own process) holds a cache fed with the same objects a
watch would deliver: one NRT per node from the synthetic layouts, plus bound pods not yet
accounted in the NRTs (about half the GPUs in use, so node states are fragmented and varied).
The client sends what kube-scheduler sends with `nodeCacheCapable: true`: the pod and every
node name to /filter, then the pod and the names that passed to /prioritize, with the cache
quiet or fed pod events as a busy cluster's watch would (`--churn`). Pods cycle through
1/2/4/8 GPUs with one NIC per GPU. The first call per pod shape fills the decision memo and is
reported apart ("cold"); the rest are steady state. "in the server" is the extender's own time
(its Server-Timing header: decode, decide, encode), without HTTP and client; "server CPU" is the
server process's CPU time per steady filter + prioritize pair, HTTP included.
"decode" is orjson (and json) decoding of
the same /filter request body, alone.

    python bench/extender.py [--nodes 1000 5000] [--rounds 200]
    python bench/extender.py --replay [--nodes 1000 5000]

`--replay`: in-process, no HTTP, bench/cluster.py's own trace (tests/scaletrace.py: its fleet
of KWOK nodes and its burst and paced pod streams, each device pod asked about the nodes
kube-scheduler's filters pass, bound to a best-scored one): CPU µs per filter and prioritize
call (from ExtenderArgs bytes to the reply's bytes) and per pod watch event (from the line to
the cache updated), the extender's fast path against the plain one: every asked node evaluated
on its own (`fit.evaluate` on the node's state, no classes, no memo; on the first
--plain-pods device pods), and pod events read as lightkube's watch reads them (a dict of the
whole object, then the model).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/layouts.py

import orjson
from agent_footprint import cpu_seconds

from rdmaplane.core import nrt
from tests.layouts import layout

LAYOUTS = ("hgx", "dgx-a100", "one-socket-nics", "split-roots")
POLICIES = ("single-numa-node", "restricted", "best-effort")
SHAPES = (1, 2, 4, 8)


def _pod(name: str, gpus: int, node: str = "") -> dict[str, Any]:
    limits = {nrt.GPU: str(gpus), nrt.HCA: str(gpus)}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "trainer",
                "resources": {"limits": limits, "requests": limits},
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    meta = {
        "name": name,
        "namespace": "jobs",
        "uid": f"uid-{name}",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running"},
    }


async def _churn(cache: Any, names: list[str], per_second: float, seed: int) -> None:
    """What a busy cluster's watch delivers: pods bound to random nodes and pods finishing
    (one of each per step), applied in the server's own event loop like watch events."""
    import asyncio

    rng = random.Random(seed + 1)
    running: list[dict[str, Any]] = []
    step = 0
    while True:
        await asyncio.sleep(1 / per_second)
        step += 1
        new = _pod(f"churn-{step}", rng.choice((1, 2)), node=rng.choice(names))
        cache.apply("pod", "ADDED", new)
        running.append(new)
        if len(running) > 50:
            cache.apply("pod", "DELETED", running.pop(rng.randrange(len(running))))


def _serve(n: int, seed: int, churn: float, sock: socket.socket, ready: Any) -> None:
    import uvicorn

    from rdmaplane.core.settings.scheduler import ExtenderSettings
    from rdmaplane.services.scheduler.cache import ClusterCache
    from rdmaplane.services.scheduler.root import create_app

    rng = random.Random(seed)
    cache = ClusterCache()
    names = [f"gpu-{i:05d}" for i in range(n)]
    cache.replace(
        "nrt",
        [
            nrt.to_object(layout(rng.choice(LAYOUTS), name, policy=rng.choice(POLICIES)))
            for name in names
        ],
    )
    cache.replace("node", [{"metadata": {"name": name}} for name in names])
    pods = []
    for name in names:
        used = 0
        while used < 4:
            gpus = rng.choice((1, 1, 2, 2, 4))
            pods.append(_pod(f"{name}-{len(pods)}", gpus, node=name))
            used += gpus
    cache.replace("pod", pods)
    feed = (lambda c, _: _churn(c, names, churn, seed)) if churn else None
    app = create_app(cache, ExtenderSettings(), feed)
    from rdmaplane.services.scheduler.serving import server_config

    config = server_config(app, app.state.direct_calls, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    ready.set()
    server.run(sockets=[sock])


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, float, bytes]:
    """(status, the server's own time in seconds from Server-Timing, body)."""
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    content = reply.read()
    timing = float((reply.getheader("Server-Timing") or "dur=0").split("dur=")[1]) / 1000
    return reply.status, timing, content


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(n: int, rounds: int, seed: int, churn: float) -> None:
    sock = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # asyncio sets TCP_NODELAY only when proto says TCP
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve, args=(n, seed, churn, sock, ready), daemon=True)
    start = time.perf_counter()
    proc.start()
    ready.wait(600)
    names = [f"gpu-{i:05d}" for i in range(n)]
    try:
        while not _healthy(port):
            time.sleep(0.05)
        setup = time.perf_counter() - start
        # A lean keep-alive client, with TCP_NODELAY as Go's (kube-scheduler's) connections have
        # (without it, Nagle + delayed ACK add 40 ms to every request with a body).
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        client.connect()
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bodies = {
            g: orjson.dumps({"Pod": _pod(f"job-{g}", g), "Nodes": None, "NodeNames": names})
            for g in SHAPES
        }
        server: list[float] = []  # Server-Timing of filter + prioritize: the extender's own time
        filt: list[float] = []
        prio: list[float] = []
        both: list[float] = []
        cold: list[float] = []
        passed: dict[int, int] = {}
        cpu_from = 0.0
        for i in range(rounds + 1):
            if i == 1:
                cpu_from = cpu_seconds(proc.pid)
            for g in SHAPES:
                t0 = time.perf_counter()
                status, timing, content = _post(client, "/filter", bodies[g])
                t1 = time.perf_counter()
                assert status == 200, content
                fit = orjson.loads(content)["NodeNames"]
                body = orjson.dumps({"Pod": _pod(f"job-{g}", g), "Nodes": None, "NodeNames": fit})
                t2 = time.perf_counter()
                status, timing2, content = _post(client, "/prioritize", body)
                t3 = time.perf_counter()
                assert status == 200, content
                if i == 0:
                    cold.append(t3 - t2 + t1 - t0)
                    passed[g] = len(fit)
                    continue
                server.append(timing + timing2)
                filt.append(t1 - t0)
                prio.append(t3 - t2)
                both.append(t3 - t2 + t1 - t0)
        server_cpu = (cpu_seconds(proc.pid) - cpu_from) / len(both)
        decode_orjson, decode_json = [], []
        for _ in range(rounds):
            for g in SHAPES:
                t0 = time.perf_counter()
                orjson.loads(bodies[g])
                t1 = time.perf_counter()
                json.loads(bodies[g])
                t2 = time.perf_counter()
                decode_orjson.append(t1 - t0)
                decode_json.append(t2 - t1)
        client.close()
    finally:
        proc.terminate()
        proc.join(10)
        sock.close()
    ms = 1000.0
    size = len(bodies[1]) / 1024
    print(
        f"{n} nodes, {f'{churn:g} pod events/s' if churn else 'no churn'} "
        f"(server setup {setup:.1f}s; filter body {size:.0f} KiB; "
        "nodes passing filter for " + ", ".join(f"{g} GPU: {passed[g]}" for g in SHAPES) + ")"
    )
    rows = (
        ("filter", filt),
        ("prioritize", prio),
        ("filter+prioritize", both),
        ("  in the server", server),
    )
    for label, values in rows:
        print(
            f"  {label:<18} p50 {statistics.median(values) * ms:7.2f} ms   "
            f"p99 {_percentile(values, 0.99) * ms:7.2f} ms   (n={len(values)})"
        )
    print(f"  server CPU per filter+prioritize (its process, steady): {server_cpu * ms:.2f} ms")
    print(f"  cold filter+prioritize (first call per pod shape): max {max(cold) * ms:.1f} ms")
    dec = statistics.median(decode_orjson)
    print(
        f"  bare decode of the filter body: orjson p50 {dec * ms:.2f} ms, "
        f"json p50 {statistics.median(decode_json) * ms:.2f} ms;"
        f" filter p50 / orjson decode p50 = {statistics.median(filt) / dec:.1f}x"
    )


def replay(n: int, seed: int, plain_pods: int) -> None:
    """The scale trace in-process: fast and plain CPU per call and per event."""
    from lightkube.core import decoders

    from rdmaplane.adapters.kube import PodDict
    from rdmaplane.services.scheduler.cache import ClusterCache
    from rdmaplane.services.scheduler.policy.fit import evaluate
    from rdmaplane.services.scheduler.watch import as_dict, read_pod_event
    from tests import scaletrace

    trace = scaletrace.trace(n, seed)
    lines: list[bytes] = []
    calls: dict[str, list[float]] = {"filter": [], "prioritize": []}

    class Timed(scaletrace.Extender):
        def see(self, kind: str, pod: dict[str, Any]) -> None:
            lines.append(scaletrace.event_line(kind, pod, len(lines) + 1))
            super().see(kind, pod)

        def answer(self, verb: str, body: bytes) -> bytes:
            t0 = time.process_time()
            reply = super().answer(verb, body)
            calls[verb].append(time.process_time() - t0)
            return reply

    extender = Timed(trace.nodes)
    gc.collect()
    gc.freeze()  # as the service does after listing
    asked = list(scaletrace.replay(trace, extender, seed))
    plain = scaletrace.Plain(trace.nodes, evaluate)
    plain_calls: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for call in asked[:plain_pods]:
        names = orjson.loads(call.filter_body)["NodeNames"]
        t0 = time.process_time()
        plain.filter(call.pod, names)
        t1 = time.process_time()
        plain.prioritize(call.pod, call.filtered["NodeNames"])
        t2 = time.process_time()
        plain_calls["filter"].append(t1 - t0)
        plain_calls["prioritize"].append(t2 - t1)
        if call.node is not None:
            plain.bind(call.pod, call.node)

    def fresh() -> ClusterCache:
        """A cache as listed, out of the collector's reach as the service leaves it."""
        cache = ClusterCache()
        cache.replace("nrt", [node.nrt for node in trace.nodes])
        cache.replace("node", [{"metadata": {"name": node.name}} for node in trace.nodes])
        cache.replace("pod", [])
        gc.collect()
        gc.freeze()
        return cache

    cache = fresh()
    t0 = time.process_time()
    for line in lines:
        event = decoders.decode_watch_event(line)
        cache.apply("pod", event.type, as_dict(decoders.decode_object(event.object, PodDict)))
    dict_path = (time.process_time() - t0) / len(lines)
    cache = fresh()
    t0 = time.process_time()
    for line in lines:
        cache.apply("pod", *read_pod_event(line))
    fast_events = (time.process_time() - t0) / len(lines)
    us = 1e6
    window = scaletrace.feasible_to_find(n)
    print(
        f"{n} nodes: {len(asked)} device pods of {len(trace.pods)}, {window} nodes asked per "
        f"pod, {len(lines)} pod events ({len(lines) / len(asked):.2f} per device pod)"
    )
    for verb in ("filter", "prioritize"):
        fast, slow = calls[verb], plain_calls[verb]
        ratio = statistics.median(slow) / statistics.median(fast)
        print(
            f"  {verb:<10} fast p50 {statistics.median(fast) * us:7.0f} µs  p99 "
            f"{_percentile(fast, 0.99) * us:7.0f} µs   plain p50 "
            f"{statistics.median(slow) * us:8.0f} µs ({len(slow)} pods)   plain/fast {ratio:.0f}x"
        )
    print(
        f"  pod event  fast {fast_events * us:5.1f} µs   as lightkube's watch reads it "
        f"{dict_path * us:5.1f} µs"
    )
    per_pod = (sum(calls["filter"]) + sum(calls["prioritize"])) / len(asked)
    per_pod += fast_events * len(lines) / len(asked)
    print(f"  in-process CPU per device pod (calls + its share of events): {per_pod * 1000:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--churn", type=float, nargs="+", default=[0, 50], help="pod events/s fed to the cache"
    )
    parser.add_argument("--replay", action="store_true", help="the scale trace, in-process")
    parser.add_argument("--plain-pods", type=int, default=100, help="with --replay")
    args = parser.parse_args()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (1/5/15 min) at start")
    if args.replay:
        for n in args.nodes:
            replay(n, args.seed, args.plain_pods)
        return
    for n in args.nodes:
        for churn in args.churn:
            measure(n, args.rounds, args.seed, churn)


if __name__ == "__main__":
    main()
