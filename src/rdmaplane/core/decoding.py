"""Wire documents decoded by one strict model layer. Pure.

Every document that comes from elsewhere (an NRT or a Pod from the API server, kube-scheduler's
ExtenderArgs, an AdmissionReview, a ResourceClaim, a node file) is declared as msgspec Structs
beside its reader, and read by `convert` (an already decoded JSON/YAML value) or `Decoder` (JSON
bytes: the extender's hot path, no intermediate dicts). Either gives the model, or one
`DecodeError` naming the field the way the docs do (`zones[1].resources[0].capacity: expected a
Kubernetes quantity`), never a traceback: msgspec says where, the model's own types say what was
expected (`a list of objects`, `one of shared, exclusive`).

Values with rules of their own are classes with a `from_wire(value)` classmethod (`Quantity`
here, others beside their documents): msgspec hands them the raw value, a `ValueError` from it
is an error at that field, and a message that starts with `.key` or `[key]` names a field
below it (the key of a mapping, which msgspec's own paths leave out).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal
from functools import cache
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi

from rdmaplane.core.errors import InputError

T = TypeVar("T")


class DecodeError(InputError):
    """A document that is not what its model says: `path` names the field (empty: the whole
    document), `reason` says what is wrong with it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


def convert(value: Any, model: type[T], where: str = "") -> T:
    """`value` (decoded JSON or YAML) as `model`; `where` prefixes every path (`Pod`)."""
    try:
        return msgspec.convert(value, model, strict=True, dec_hook=_from_wire)
    except msgspec.ValidationError as exc:
        raise _error(exc, model, where) from None
    except RecursionError:
        raise DecodeError(where, _TOO_DEEP) from None


_TOO_DEEP = "nested deeper than any real document"


class Decoder:
    """JSON bytes straight to `model`; `msgspec.DecodeError` (not JSON at all, or nested
    deeper than Python recurses) passes through."""

    def __init__(self, model: type[T]) -> None:
        self.model = model
        self._decoder = msgspec.json.Decoder(model, dec_hook=_from_wire)

    def decode(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _error(exc, self.model, "") from None
        except RecursionError:
            raise msgspec.DecodeError(_TOO_DEEP) from None


def _from_wire(kind: type, value: Any) -> Any:
    read: Callable[[Any], Any] | None = getattr(kind, "from_wire", None)
    if read is None:
        raise NotImplementedError(f"no wire form for {kind.__name__}")
    return read(value)


# ---------------------------------------------------------------------------------------------
# Kubernetes quantities

_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?$"
)
_SUFFIX = {"m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9)}
_SUFFIX |= {"T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}
_SUFFIX |= {
    s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))
}


def parse_quantity(obj: Any) -> Decimal | None:
    """A Kubernetes quantity ("8", "1.5", "500m", "64Gi", "1e3", a JSON integer), else None."""
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return Decimal(obj) if abs(obj) < 2**63 else None
    if not isinstance(obj, str):
        return None
    match = _QUANTITY.match(obj.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    value = Decimal(number)
    if exponent:
        if abs(int(exponent[1:])) > 30:  # beyond what Kubernetes stores; never build such a number
            return None
        value = value.scaleb(int(exponent[1:]))
    value = value * _SUFFIX[suffix] if suffix else value
    return value if abs(value) < 2**63 else None


class Quantity(int):
    """A non-negative quantity (int-or-string on the wire) as a whole count, fractions rounded
    up: ours are device counts; others (a producer's `cpu: 500m`) are carried, never read."""

    expected = "a non-negative Kubernetes quantity"

    @classmethod
    def from_wire(cls, value: Any) -> Quantity:
        quantity = parse_quantity(value)
        if quantity is None or quantity < 0:
            raise ValueError(f"expected {cls.expected}, got {value!r}")
        return cls(int(quantity.to_integral_value(rounding=ROUND_CEILING)))


# ---------------------------------------------------------------------------------------------
# Errors in the docs' words

_WHERE = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_TOKEN = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")
_MISMATCH = re.compile(r"^Expected `[^`]*`, got `[^`]*`$")
_FIELD = re.compile(r"^Object (missing required|contains unknown) field `([^`]*)`$")


def _error(exc: msgspec.ValidationError, model: Any, where: str) -> DecodeError:
    found = _WHERE.match(str(exc))
    assert found is not None  # the pattern matches every string
    message, path = found["message"], found["path"] or ""
    field = _FIELD.match(message)
    if field is not None:
        path = f"{path}.{field[2]}"
    elif message[:1] in ".[" and _TOKEN.match(message):  # a hook's message naming a field below
        head, _, message = message.partition(": ")
        path += head
    tokens = [name or f"[{index}]" for name, index in _TOKEN.findall(path)]
    kind = _type_at(mi.type_info(model), tokens)
    if field is not None and field[1] == "contains unknown":
        reason = "unknown field"
    elif field is not None or _MISMATCH.match(message):
        reason = f"expected {phrase(kind, shape=True)}" if kind is not None else _lower(message)
    elif message.startswith("Invalid enum value ") and kind is not None:
        reason = f"{message.removeprefix('Invalid enum value ')} is not {phrase(kind)}"
    else:
        reason = _lower(message)
    return DecodeError(_path(where, tokens), reason)


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


def _path(where: str, tokens: list[str]) -> str:
    out = where
    for token in tokens:
        out += token if token.startswith("[") or not out else f".{token}"
    return out


def _type_at(kind: mi.Type | None, tokens: list[str]) -> mi.Type | None:
    """The model's type at a path of field names and `[index]`es (None where it is not known)."""
    for token in tokens:
        kind = _one(kind, token)
        if kind is None:
            return None
        if isinstance(kind, mi.StructType | mi.DataclassType | mi.TypedDictType):
            if token.startswith("["):
                return None
            kind = next((f.type for f in kind.fields if f.encode_name == token), None)
        elif isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
            kind = kind.item_type
        elif isinstance(kind, mi.DictType):
            kind = kind.value_type
        else:
            return None
    return _one(kind, "")


def _one(kind: mi.Type | None, token: str) -> mi.Type | None:
    """Of a union, the member a token goes into (a field name: an object; an index: a list)."""
    if not isinstance(kind, mi.UnionType):
        return kind
    if not token:
        return kind
    containers = [t for t in kind.types if not isinstance(t, mi.NoneType)]
    return containers[0] if len(containers) == 1 else None


@cache
def _custom(cls: type) -> str:
    return str(getattr(cls, "expected", f"a {cls.__name__}"))


def phrase(kind: mi.Type, shape: bool = False) -> str:
    """What a value of `kind` is, for people: `a string`, `a list of objects`, `an object or
    null`, `one of shared, exclusive, unknown` (with `shape`, a choice says only its type:
    `a string`)."""
    if isinstance(kind, mi.UnionType):
        return " or ".join(dict.fromkeys(phrase(t, shape) for t in kind.types))
    if isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        item = phrase(kind.item_type, shape=True)
        return "a list" if item == "any value" else f"a list of {_plural(item)}"
    values = (
        [m.value for m in kind.cls]
        if isinstance(kind, mi.EnumType)
        else list(kind.values)
        if isinstance(kind, mi.LiteralType)
        else None
    )
    if values is not None:
        if shape:
            return "a string" if all(isinstance(v, str) for v in values) else "an integer"
        return "one of " + ", ".join(map(str, values))
    if isinstance(kind, mi.CustomType):
        return _custom(kind.cls)
    return _NAMES.get(type(kind), "any value")


def _plural(item: str) -> str:
    word = item.split(" ", 1)[1] if item.startswith(("a ", "an ")) else item
    return {"null": "nulls"}.get(word, word + "s")


_NAMES: dict[type, str] = {
    mi.StrType: "a string",
    mi.IntType: "an integer",
    mi.FloatType: "a number",
    mi.BoolType: "a boolean",
    mi.NoneType: "null",
    mi.DictType: "an object",
    mi.StructType: "an object",
    mi.DataclassType: "an object",
    mi.TypedDictType: "an object",
}
