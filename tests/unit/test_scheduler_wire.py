"""The extender's request reader: junk of any shape is refused with a message, never a crash."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.services.scheduler.policy import podrequest, score, wire

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
KEYS = st.sampled_from(
    [
        "Pod",
        "Nodes",
        "NodeNames",
        "spec",
        "containers",
        "initContainers",
        "resources",
        "limits",
        "requests",
        "nvidia.com/gpu",
        "rdmaplane.io/hca",
        "items",
        "metadata",
        "name",
    ]
)
# Junk that looks like the real thing: the known keys, nested at random.
SHAPED = st.recursive(
    st.none()
    | st.integers(-3, 10)
    | st.sampled_from(["1", "x", "1.5", "2k", "", "1e999999999", "9" * 40]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=40,
)


@given(st.one_of(JSON, SHAPED))
def test_any_json_is_read_or_refused_with_a_message(value: object) -> None:
    try:
        args = wire.parse_args(orjson.dumps(value))
        request = podrequest.pod_request(args.pod)
    except (wire.WireError, podrequest.RequestError) as err:
        assert str(err)
        return
    assert all(isinstance(n, str) for n in args.node_names)
    assert min(request.total.values(), default=0) >= 0


@given(st.binary(max_size=64))
def test_any_bytes_are_read_or_refused(body: bytes) -> None:
    try:
        wire.parse_args(body)
    except wire.WireError as err:
        assert str(err)


def test_upstream_shapes() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    assert wire.parse_args(
        orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["a"]})
    ).node_names == ["a"]
    nodes = {"items": [{"metadata": {"name": "b"}}]}
    args = wire.parse_args(orjson.dumps({"Pod": pod, "Nodes": nodes, "NodeNames": None}))
    assert args.node_names == ["b"] and args.nodes == nodes
    result = orjson.loads(wire.filter_result(args, ["b"], {}, {}))
    assert result == {
        "Nodes": nodes,
        "NodeNames": ["b"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    assert orjson.loads(wire.priorities(["b"], [7])) == [{"Host": "b", "Score": 7}]
    with pytest.raises(wire.WireError, match=r"^NodeNames\[1\]: expected a string$"):
        wire.parse_args(orjson.dumps({"Pod": pod, "NodeNames": ["a", None]}))


@given(st.lists(st.tuples(st.text(max_size=12), st.integers(-3, score.MAX_SCORE + 3)), max_size=30))
def test_priorities_are_the_host_priority_list(rows: list[tuple[str, int]]) -> None:
    """Names that need escaping or not, in range or not: the list kube-scheduler reads, in
    order."""
    hosts, scores = [h for h, _ in rows], [s for _, s in rows]
    expected = [{"Host": h, "Score": s} for h, s in rows]
    assert orjson.loads(wire.priorities(hosts, scores)) == expected
