"""How a setting is declared, once: a field of its component's frozen settings dataclass, with
its default, what it is for and its limits.

    poll_interval_s: Seconds = setting(5.0, "cheap change detection", gt=0)

Code builds the dataclasses directly and gets the defaults and the checks of `__post_init__`;
the config layer (`rdmaplane.adapters.config`) reads files straight into the same dataclasses,
holding
each value to its limits (`gt`, `ge`, `lt`, `le`, `min_length`, `pattern`). A file's key follows
the attribute (`key_for`: `poll_interval_s` → `pollInterval`, the unit is in the value) unless
`key=` names another (`deviceIDs`). A check in `__post_init__` that names one field raises
`FieldError(attribute, reason)`; a file's error then names the key.

Durations are float seconds in code (`Seconds`) and written as Kubernetes component configs
write them in files (`5s`, `1m30s`, `500ms`; a plain number is seconds). Stdlib only: a command
that reads no file never loads the validator.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Annotated, Any

_LIMITS = ("gt", "ge", "lt", "le", "min_length", "pattern")


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    key: str | None = None,
    **limits: float | int | str,
) -> Any:
    """A dataclass field with its default (or `factory`), what it is for (`doc`: what
    `rdmaplane config defaults` prints beside it) and the limits a file's value must keep."""
    unknown = set(limits) - set(_LIMITS)
    if unknown:
        raise TypeError(f"not a limit: {', '.join(sorted(unknown))}")
    metadata: dict[str, object] = {"description": doc, **limits}
    if key is not None:
        metadata["alias"] = key
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def key_for(name: str) -> str:
    """The file's key for an attribute: `node_name` → `nodeName`, `poll_interval_s` →
    `pollInterval` (the unit is in the value: `5s`)."""
    head, *rest = name.removesuffix("_s").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def key_of(field: dataclasses.Field[Any]) -> str:
    """The file's key of a settings field: its own `key`, else `key_for` its name."""
    return str(field.metadata.get("alias") or key_for(field.name))


def doc_of(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("description", ""))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: object) -> object:
    """`1m30s`, `500ms`, `5s` (Go's duration syntax, as Kubernetes configs use it) → seconds;
    numbers are seconds already; anything else is left for the float check to refuse."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration (e.g. 5s, 1m30s, 500ms, or seconds)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    """The shortest duration string for `seconds`: 600 → `10m`, 90 → `1m30s`, 0.05 → `50ms`."""
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    out = ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        out += f"{count}{unit}" if count else ""
    return out


class _Duration:
    """Marks a float of seconds that files write as a duration. The validator asks the mark
    how to read and write it (pydantic's `__get_pydantic_core_schema__` protocol); the import
    of pydantic's core happens then, never when a settings module loads."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(
            parse_duration,
            handler(source),
            serialization=core_schema.plain_serializer_function_ser_schema(
                format_duration, return_schema=core_schema.str_schema(), when_used="json"
            ),
        )

    def __repr__(self) -> str:
        return "Duration"


DURATION = _Duration()
Seconds = Annotated[float, DURATION]


def one_or_many(value: object) -> object:
    """A single string as a list of one: a names setting written either way (`gpu: a/b` or
    `gpu: [a/b, c/d]`)."""
    return (value,) if isinstance(value, str) else value


def _one_or_list(names: tuple[str, ...]) -> object:
    """How a file writes names: one alone, more as a list."""
    return names[0] if len(names) == 1 else list(names)


class _OneOrMany:
    """Marks a list setting that a file may give as one string too (see `_Duration`)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(
            one_or_many,
            handler(source),
            serialization=core_schema.plain_serializer_function_ser_schema(
                _one_or_list, when_used="json"
            ),
        )

    def __repr__(self) -> str:
        return "OneOrMany"


Names = Annotated[tuple[str, ...], _OneOrMany()]
