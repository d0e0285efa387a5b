"""What every rdmaplane config file shares: a versioned kind, camelCase keys, strict checks.

A config file is one `Kind` (`apiVersion: rdmaplane.io/v1alpha1`, `kind: AgentConfig` …) whose
content is validated straight into its component's frozen settings dataclass: each setting is
defined once, there (`rdmaplane.core.settings`), with its default, limits and description; this
layer only reads files into them. Unknown keys are errors (a typo must never fall back to a
default silently), and every error names the file and the key, with the key it probably meant
when the key is unknown.

The validator (pydantic's `TypeAdapter` over the dataclasses) is built when a file is first
read: a command given no file gets the dataclasses' defaults without loading pydantic.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar, Union

from rdmaplane.adapters.documents import DocumentError, read_document
from rdmaplane.core import names
from rdmaplane.core.errors import InputError
from rdmaplane.core.settings import doc_of, key_for, key_of
from rdmaplane.core.untrusted import FieldError, what_it_is

API_VERSION: Final = names.CONFIG_API_VERSION
T = TypeVar("T")
Loc = tuple[int | str, ...]


class ConfigError(InputError):
    """A config that cannot be used; the one-line message names the file and the key."""


@dataclass(frozen=True)
class Kind(Generic[T]):
    """A kind of config file: its `name` (the file's `kind:`), the settings dataclass it is
    read into, where its keys are explained (`docs`) and what reads it (`read_by`).
    `older_format`, when a kind reads one, turns a file without apiVersion/kind into the
    versioned shape (the device plugin reads the shared RDMA plugin's `configList`)."""

    name: str
    settings: type[T]
    docs: str
    read_by: str
    older_format: Callable[[Mapping[str, object], str], dict[str, object]] | None = None

    def unversioned(self, doc: Mapping[str, object], source: str) -> dict[str, object]:
        """A file without apiVersion/kind, in the versioned shape; else an error saying what
        to add."""
        if self.older_format is not None:
            return self.older_format(doc, source)
        raise ConfigError(self.lacks_version(source))

    def lacks_version(self, source: str) -> str:
        return (
            f"{source}: no apiVersion/kind: add `apiVersion: {API_VERSION}` and "
            f"`kind: {self.name}` at the top (keys are camelCase; see {self.docs})"
        )


def load(path: str | Path | None, kind: Kind[T], **overrides: object) -> T:
    """The config in the file at `path` (None: the defaults), with `overrides` (attribute
    name → value, e.g. CLI flags; None values are ignored) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if path is None:
        if not given:
            return kind.settings()
        return parse({"apiVersion": API_VERSION, "kind": kind.name}, kind, "", **given)
    try:
        doc = read_document(path)
    except DocumentError as e:
        raise ConfigError(str(e)) from None
    return parse(doc, kind, str(path), **given)


def parse(doc: object, kind: Kind[T], source: str, **overrides: object) -> T:
    """Validate a parsed document as `kind`; `ConfigError` names `source` and every bad key."""
    prefix = f"{source}: " if source else ""
    if doc is None:
        raise ConfigError(f"{prefix}empty; a config file starts with apiVersion and kind")
    if not isinstance(doc, dict):
        got = what_it_is(doc)
        raise ConfigError(f"{prefix}expected a mapping with apiVersion and kind, got {got}")
    if "apiVersion" not in doc and "kind" not in doc:
        doc = kind.unversioned(doc, source or "configuration")
    _check_version(doc, kind, prefix)
    data = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
    keys = {f.name: key_of(f) for f in dataclasses.fields(kind.settings)}  # type: ignore[arg-type]
    for name, value in overrides.items():
        if value is not None:
            data[keys[name]] = value
    return validate(kind.settings, data, prefix)


def _check_version(doc: Mapping[str, object], kind: Kind[Any], prefix: str) -> None:
    version, name = doc.get("apiVersion"), doc.get("kind")
    if version != API_VERSION:
        said = "missing" if version is None else f"{version!r} is not supported"
        raise ConfigError(f"{prefix}apiVersion: {said}; use {API_VERSION}")
    if name != kind.name:
        from rdmaplane.adapters.config import kinds  # the other kind, for the hint only

        other = kinds.kind(str(name)) if name in kinds.names() else None
        hint = f" (a {name} is read by {other.read_by})" if other else ""
        said = "missing" if name is None else f"{name!r}"
        raise ConfigError(f"{prefix}kind: {said}; expected {kind.name}{hint}")


# ------------------------------------------------------------------------------- validation

MAX_ROUNDS = 8  # a section nests a few deep; each round reaches one level of checks further
_CONFIG: Final = {
    "alias_generator": key_for,
    "validate_by_name": False,  # files use the keys, never the attribute names
    "validate_by_alias": True,
    "extra": "forbid",
    "allow_inf_nan": False,  # `.inf`, `.nan`, `1e400`: never a setting, always a mistake
}


_ADAPTERS: dict[type[Any], Any] = {}


def adapter(settings: type[Any]) -> Any:
    """pydantic's validator of a settings dataclass, built on first use. (`X | None`: a
    dataclass given alone would refuse the config that the nested ones inherit.)"""
    if settings not in _ADAPTERS:
        from pydantic import TypeAdapter

        _ADAPTERS[settings] = TypeAdapter(settings | None, config=_CONFIG)  # type: ignore[arg-type]
    return _ADAPTERS[settings]


def validate(settings: type[T], data: Mapping[str, object], prefix: str = "") -> T:
    """`data` validated as `settings`, or `ConfigError` with every problem at once. A
    section's own checks (`__post_init__`) run only once its fields are valid, so each round
    leaves out the keys that failed (their defaults stand in; a required one left out is not a
    new problem) and validates again, until no new problem shows."""
    from pydantic import ValidationError

    problems: list[str] = []
    removed: set[Loc] = set()
    current = dict(data)
    for _ in range(MAX_ROUNDS):
        try:
            result: T = adapter(settings).validate_python(current)
        except ValidationError as e:
            errors = [
                err
                for err in e.errors(include_url=False)
                if not (err["type"] == "missing" and _under(err["loc"], removed))
            ]
            judged = [_problem(settings, err) for err in errors]
            found = [p for p in dict.fromkeys(p for p, _ in judged) if p not in problems]
            problems += found
            paths = {path for _, path in judged}
            if not found or paths <= removed:
                break
            removed |= paths
            current = _without(current, paths)
        else:
            if not problems:
                return result
            break
    raise ConfigError(prefix + "; ".join(problems))


_MESSAGES = {  # pydantic's words where they would name our classes or say tuple
    "dataclass_type": "Input should be a valid dictionary",
    "tuple_type": "Input should be a valid list",
}


def _problem(settings: type[Any], error: Any) -> tuple[str, Loc]:
    """(`key.path: what is wrong`, the key path it is at) of one of pydantic's errors. A
    check that names its field (`FieldError`) is at that field's key."""
    loc: Loc = tuple(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc, message = loc + _keys(settings, loc, cause.field), cause.reason
    elif error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        message = "unknown key" + _did_you_mean(settings, loc)
    else:
        message = _MESSAGES.get(error["type"], str(error["msg"]).removeprefix("Value error, "))
        if message.startswith("Tuple "):  # a list in the file, held as a tuple
            message = "List " + message.removeprefix("Tuple ")
    return (f"{where(loc)}: {message}" if loc else message), _key_path(loc)


def where(loc: Loc) -> str:
    """`pools[0].nccl.gid`: a key path as the errors write it."""
    return "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)
    )


def _keys(settings: type[Any], loc: Loc, field: str) -> Loc:
    """The file's keys of an attribute path (`dra.enabled`) below the section at `loc`."""
    section, keys = settings_at(settings, loc), list[str]()
    for name in field.split("."):
        found = next((f for f in _fields(section) if f.name == name), None)
        if section is None or found is None:
            return (*keys, *field.split(".")[len(keys) :])
        keys.append(key_of(found))
        section = dataclass_in(_hints(section)[name])
    return tuple(keys)


def _key_path(loc: Loc) -> Loc:
    """The key an error's location is at (a list item's: the list's)."""
    path = list(loc)
    while path and isinstance(path[-1], int):
        path.pop()
    return tuple(path)


def _under(loc: Loc, paths: set[Loc]) -> bool:
    return any(loc[: len(p)] == p for p in paths)


def _without(data: dict[str, object], paths: set[Loc]) -> dict[str, object]:
    """`data` less the key at each path."""
    out: dict[str, object] = json.loads(json.dumps(data, default=str))
    for path in paths:
        node: object = out
        for part in path[:-1]:
            node = _child(node, part)
        if path and isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _child(node: object, part: int | str) -> object:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    return None


def _did_you_mean(settings: type[Any], loc: Sequence[int | str]) -> str:
    """` (did you mean nodeName?)` for an unknown key, when a known one is near."""
    section = settings_at(settings, loc[:-1])
    if section is None or not isinstance(loc[-1], str):
        return ""
    keys = [key_of(f) for f in _fields(section)]
    unknown = loc[-1]
    near = [key_for(unknown)] if key_for(unknown) in keys else []  # snake_case of a key
    near = near or sorted(  # a unit spelled into the key (`window`), or a part left out
        (k for k in keys if unknown.lower().startswith(k.lower()) or k.startswith(unknown)),
        key=len,
        reverse=True,
    )
    near = near or difflib.get_close_matches(unknown, keys, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


# ---------------------------------------------------------------------- the dataclasses' shape


def settings_at(settings: type[Any], loc: Sequence[int | str]) -> type[Any] | None:
    """The settings dataclass at `loc` inside `settings`, following fields and list items."""
    current: object = settings
    for part in loc:
        if isinstance(part, int):
            current = item_type(current)
            continue
        section = dataclass_in(current)
        if section is None:
            return None
        field = next((f for f in _fields(section) if key_of(f) == part), None)
        if field is None:
            return None
        current = _hints(section)[field.name]
    return dataclass_in(current)


def _fields(section: type[Any] | None) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(section) if section is not None else ()


def _hints(section: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(section)


def dataclass_in(annotation: object) -> type[Any] | None:
    """The dataclass an annotation holds (`X`, `X | None`), else None."""
    for candidate in (annotation, *_union_args(annotation)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def item_type(annotation: object) -> object:
    """What a list setting (`tuple[X, ...]`, `X | None` of one) holds."""
    for candidate in (annotation, *_union_args(annotation)):
        if typing.get_origin(candidate) in (list, tuple, Sequence):
            return typing.get_args(candidate)[0]
    return None


def _union_args(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return ()


# ----------------------------------------------------------------------------- documented defaults


def render_defaults(kind: Kind[Any]) -> str:
    """The kind's defaults as a YAML file, each key with its description as a comment: what
    the docs show (a test keeps the docs equal to this) and `rdmaplane config defaults` prints."""
    data = adapter(kind.settings).dump_python(kind.settings(), mode="json", by_alias=True)
    lines = [
        f"# {kind.name} defaults (rdmaplane config defaults {kind.name})",
        f"apiVersion: {API_VERSION}  # the only version so far",
        f"kind: {kind.name}",
    ]
    return "\n".join([*lines, *_emit(kind.settings, data, 0)]) + "\n"


def _emit(settings: type[Any], data: Mapping[str, Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    hints = _hints(settings)
    for field in dataclasses.fields(settings):
        key, doc = key_of(field), doc_of(field)
        value = data[key]
        comment = f"  # {doc}" if doc else ""
        annotation = hints[field.name]
        section, item = dataclass_in(annotation), dataclass_in(item_type(annotation))
        if section is not None and isinstance(value, dict):
            lines += [f"{pad}{key}:{comment}", *_emit(section, value, indent + 2)]
        elif item is not None and isinstance(value, list) and value:
            lines.append(f"{pad}{key}:{comment}")
            for entry in value:
                entry_lines = _emit(item, entry, indent + 2)
                entry_lines[0] = f"{pad}- {entry_lines[0].lstrip()}"
                lines += entry_lines
        elif isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:{comment}")
            lines += [f"{pad}  {k}: {_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}{comment}")
    return lines


def _scalar(value: object) -> str:
    import yaml

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_scalar, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    text = str(value)
    plain = text and text == text.strip() and not any(c in text for c in ":#{}[],&*!|>'\"%@`")
    return text if plain and yaml.safe_load(text) == text else json.dumps(text)
