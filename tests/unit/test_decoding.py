"""The wire documents' model layer: what a bad field is called, and what was expected there."""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Any, Literal

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.decoding import DecodeError, Decoder, Quantity, convert, parse_quantity


class Mode(enum.StrEnum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"


class Keyed(dict[str, int]):
    @classmethod
    def from_wire(cls, value: Any) -> Keyed:
        bad = next((k for k, v in value.items() if not isinstance(v, int)), None)
        if bad is not None:
            raise ValueError(f".{bad}: expected an integer")
        return cls(value)


class Item(msgspec.Struct, rename="camel"):
    name: str
    max_count: Quantity = Quantity(0)


class Tree(msgspec.Struct):
    kids: list[Tree] = []


class Doc(msgspec.Struct):
    items: list[Item]
    mode: Mode | None = None
    kind: Literal["a", "b"] = "a"
    links: Keyed | None = None
    tags: list[str] = []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "items: expected a list of objects"),
        ({"items": "x"}, "items: expected a list of objects"),
        ({"items": [{"name": 7}]}, "items[0].name: expected a string"),
        ({"items": [{}]}, "items[0].name: expected a string"),
        ({"items": [{"name": "a", "maxCount": "lots"}]}, "items[0].maxCount: expected a non-"),
        ({"items": [], "mode": 3}, "mode: expected a string or null"),
        ({"items": [], "mode": "solo"}, "mode: 'solo' is not one of shared, exclusive or null"),
        ({"items": [], "kind": "c"}, "kind: 'c' is not one of a, b"),
        ({"items": [], "links": {"0000:17:00.0": "4"}}, "links.0000:17:00.0: expected an integer"),
        ({"items": [], "tags": [1]}, "tags[0]: expected a string"),
        ([], "expected an object"),
    ],
)
def test_a_bad_field_is_named_with_what_was_expected(doc: Any, message: str) -> None:
    with pytest.raises(DecodeError) as err:
        convert(doc, Doc)
    assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(DecodeError) as from_bytes:
        Decoder(Doc).decode(orjson.dumps(doc))
    assert str(from_bytes.value) == str(err.value)  # one model, one answer, dict or bytes


def test_where_prefixes_and_depth_is_refused() -> None:
    with pytest.raises(DecodeError, match=r"^Doc\.items: expected"):
        convert({}, Doc, "Doc")
    deep: Any = {}
    for _ in range(5000):
        deep = {"kids": [deep]}
    with pytest.raises(DecodeError, match="nested deeper"):
        convert(deep, Tree)
    with pytest.raises(msgspec.DecodeError, match="nested deeper"):
        Decoder(Doc).decode(b'{"items": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    ok = convert({"items": [{"name": "a", "maxCount": "2k"}], "mode": "shared"}, Doc)
    assert ok.items[0].max_count == 2000 and ok.mode is Mode.SHARED


@given(st.integers(0, 2**40), st.sampled_from(["", "k", "Ki", "m", "M"]))
def test_quantities_round_up_to_whole_counts(n: int, suffix: str) -> None:
    text = f"{n}{suffix}"
    exact = parse_quantity(text)
    assert exact is not None and exact >= 0
    assert Quantity.from_wire(text) == int(exact.to_integral_value("ROUND_CEILING"))
    assert parse_quantity(n) == Decimal(n)
    assert parse_quantity(True) is None and parse_quantity("1e99") is None
