"""The extender's fast path decides as the plain path does, on the scale test's whole trace.

Fast: the extender as deployed (tests/scaletrace.py): pod events decoded straight from watch
lines into `rdmaplane.core.pod.Pod`, node states interned into classes and kept by subtracting each
bound pod, decisions memoised per (class, request) and looked up in bulk, the prioritize call
answered from its filter call, replies serialised from ExtenderArgs bytes. Plain: every node's
state recomputed from its NRT and the pods bound to it, every asked node evaluated on its own.
For every pod of bench/cluster.py's burst and paced streams on its 1,000-node fleet: the same
nodes pass, fail and fail for good with the same reasons, and score the same.
"""

from __future__ import annotations

from collections import Counter

from tests import scaletrace


def test_fast_and_plain_paths_decide_the_same_on_the_scale_trace() -> None:
    trace = scaletrace.trace(1000)
    plain = scaletrace.Plain(trace.nodes)
    outcomes: Counter[str] = Counter()
    asked = 0
    for call in scaletrace.replay(trace, scaletrace.Extender(trace.nodes)):
        names = scaletrace.orjson.loads(call.filter_body)["NodeNames"]
        assert call.filtered == plain.filter(call.pod, names), call.pod["metadata"]["name"]
        passed = call.filtered["NodeNames"]
        assert call.scores == plain.prioritize(call.pod, passed), call.pod["metadata"]["name"]
        if call.node is not None:
            plain.bind(call.pod, call.node)
        asked += 1
        outcomes["passed"] += len(passed)
        outcomes["failed"] += len(call.filtered["FailedNodes"])
        outcomes["unresolvable"] += len(call.filtered["FailedAndUnresolvableNodes"])
        outcomes.update(f"score {s['Score']}" for s in call.scores)
    device_pods = sum(map(scaletrace.asks_devices, trace.pods))
    assert asked == device_pods > 1000
    # the trace reaches every kind of answer, and more than one score
    assert min(outcomes["passed"], outcomes["failed"], outcomes["unresolvable"]) > 0, outcomes
    assert sum(1 for k in outcomes if k.startswith("score ")) >= 3, outcomes
