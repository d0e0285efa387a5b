"""The resource vocabulary and the named resource vector."""

from __future__ import annotations

import copy
import pickle
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.resources import (
    DEFAULT,
    NONE,
    Amounts,
    Vocabulary,
    VocabularyError,
    is_extended,
)

NAMES = st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "example.com/ib", "rdma/a", "x.io/y"])
COUNTS = st.dictionaries(NAMES, st.integers(0, 9), max_size=5)


@given(COUNTS, COUNTS)
def test_amounts_count_like_a_frozen_counter(a: dict[str, int], b: dict[str, int]) -> None:
    x, y = Amounts(a), Amounts(b)
    ca, cb = Counter(a), Counter(b)
    assert x + y == ca + cb and x | y == ca | cb
    assert (x + y) - y == x
    assert x == {k: v for k, v in a.items() if v} and hash(x) == hash(Amounts(dict(a)))
    assert all(x[n] == a.get(n, 0) for n in ["nvidia.com/gpu", "nowhere.io/z"])
    assert set(x) == {k for k, v in a.items() if v} and bool(x) == any(a.values())
    assert x.total() == sum(a.values()) and x.only(b) == {k: a[k] for k in b if a.get(k)}
    assert copy.deepcopy(x) == x and pickle.loads(pickle.dumps(x)) == x
    with pytest.raises(TypeError):
        x["nvidia.com/gpu"] = 1  # type: ignore[index]


@given(st.permutations(["nvidia.com/gpu", "amd.com/gpu", "example.com/ib", "rdma/a", "x.io/y"]))
def test_vocabulary_travels_as_its_attribute(names: list[str]) -> None:
    vocabulary = Vocabulary(tuple(names[:2]), tuple(names[2:3]), tuple(names[3:]))
    assert Vocabulary.from_attribute(vocabulary.to_attribute()) == vocabulary
    assert [vocabulary.kind(n) for n in names] == ["gpu", "gpu", "exclusive", "shared", "shared"]
    assert vocabulary.rooted == tuple(names[:3]) and vocabulary.within(vocabulary)


def test_a_node_names_its_own_then_the_readers() -> None:
    node = Vocabulary(("amd.com/gpu",), ("rdmaplane.io/hca-shared",), ("rdma/a",))
    merged = node.with_defaults(DEFAULT)
    assert merged.gpus == ("amd.com/gpu", "nvidia.com/gpu")
    assert merged.exclusive == ("rdmaplane.io/hca-shared", "rdmaplane.io/hca")  # its kind wins
    assert merged.shared == ("rdma/a",)
    assert Vocabulary(shared=()).within(DEFAULT) and not node.within(DEFAULT)
    assert DEFAULT.wants_rdma({"rdmaplane.io/hca": 1}) and not DEFAULT.wants_rdma(
        {"nvidia.com/gpu": 1}
    )
    assert Vocabulary.of(["amd.com/gpu"], [("a.io/x", "shared"), ("b.io/y", "exclusive")]) == (
        Vocabulary(("amd.com/gpu",), ("b.io/y",), ("a.io/x",))
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Vocabulary(("nvidia.com/gpu",), ("nvidia.com/gpu",)), "as gpu and as exclusive"),
        (lambda: Vocabulary(("gpu",)), "'gpu' is not an extended resource name"),
        (lambda: Vocabulary(("kubernetes.io/x",)), "is not an extended resource name"),
        (lambda: Vocabulary.from_attribute("a.io/b=gpu,c.io/d=fast"), "'c.io/d=fast'"),
    ],
)
def test_names_that_cannot_be_told_apart_are_refused(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(VocabularyError, match=message):
        make()


def test_extended_resources_are_upstreams() -> None:
    assert is_extended("nvidia.com/gpu") and is_extended("rdma/hca_shared_devices_a")
    assert not any(map(is_extended, ["cpu", "hugepages-2Mi", "kubernetes.io/x", "requests.a/b"]))
    assert not NONE and NONE == {}
