"""What every rdmaplane config file shares: a versioned kind, camelCase keys, strict checks.

A config file is one `Kind` (`apiVersion: rdmaplane.io/v1alpha1`, `kind: AgentConfig` …) made of
`Section`s. Python code uses the snake_case attribute names; files use camelCase keys, derived
from the attribute names by `key_for`. Durations are written as Kubernetes component configs
write them (`5s`, `1m30s`, `500ms`; a plain number is seconds) and held as float seconds in
attributes named `..._s` (`poll_interval_s` ↔ `pollInterval: 5s`, type `Seconds`). Unknown keys
are errors (a typo must never fall back to a default silently), and every error names the file
and the key, with the key it probably meant when the key is unknown.

Adding a section to a kind is one `Section` class and one field on the kind; adding a kind is
one `Kind` subclass in a module of this package, named in `KIND_MODULES` (and in `__init__`'s
TYPE_CHECKING imports, for the type checker): loading, the error wording, `rdmaplane config
defaults|validate` and the docs test pick it up.

Models are built lazily (`defer_build`): pydantic builds a model's validator when it first
validates, not when the class is created, so the models a command never uses (the shared RDMA
plugin's format when the file is native, the kinds of other commands) cost it nothing.
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
)
from pydantic.alias_generators import to_camel

from rdmaplane.documents import DocumentError, read_document

API_VERSION: Final = "rdmaplane.io/v1alpha1"


class ConfigError(ValueError):
    """A config that cannot be used; the one-line message names the file and the key."""


def key_for(name: str) -> str:
    """The file's key for an attribute: `node_name` → `nodeName`, `poll_interval_s` →
    `pollInterval` (the unit is in the value: `5s`)."""
    return to_camel(name.removesuffix("_s"))


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


Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]


class Section(BaseModel):
    """A part of a config file: camelCase keys in files, snake_case names in code."""

    model_config = ConfigDict(
        alias_generator=key_for,
        validate_by_name=True,  # code may say AgentConfig(node_name=...); files may not
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        defer_build=True,
        allow_inf_nan=False,  # `.inf`, `.nan`, `1e400`: never a setting, always a mistake
    )


# The module of each kind: imported when the kind is first asked for.
KIND_MODULES: Final = {
    "AgentConfig": "rdmaplane.config.agent",
    "DevicePluginConfig": "rdmaplane.config.deviceplugin",
    "SchedulerExtenderConfig": "rdmaplane.config.extender",
    "WebhookConfig": "rdmaplane.config.webhook",
    "RdmaDeviceConfig": "rdmaplane.config.dra",
}
KINDS: dict[str, type[Kind]] = {}  # every kind defined so far, by name


def kind_named(name: str) -> type[Kind] | None:
    """The kind called `name`, imported if need be; None when there is none."""
    if name not in KINDS and name in KIND_MODULES:
        importlib.import_module(KIND_MODULES[name])
    return KINDS.get(name)


def all_kinds() -> dict[str, type[Kind]]:
    """`KINDS`, with every kind of `KIND_MODULES` imported."""
    for module in KIND_MODULES.values():
        importlib.import_module(module)
    return KINDS


class Kind(Section):
    """The top level of a config file. Subclasses declare `kind: Literal["X"] = "X"`."""

    api_version: Literal["rdmaplane.io/v1alpha1"] = Field(
        default=API_VERSION, alias="apiVersion", description="the only version so far"
    )
    # Set by every subclass: where its keys are explained, and what reads the file.
    docs: ClassVar[str] = ""
    read_by: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        KINDS[str(cls.model_fields["kind"].default)] = cls

    @classmethod
    def unversioned(cls, doc: Mapping[str, object], source: str) -> dict[str, object]:
        """A file without apiVersion/kind, in the versioned shape; by default an error saying
        what to add. A kind that reads an older format (the device plugin) overrides this."""
        raise ConfigError(
            f"{source}: no apiVersion/kind: add `apiVersion: {API_VERSION}` and "
            f"`kind: {cls.__name__}` at the top (keys are camelCase; see {cls.docs})"
        )


K = TypeVar("K", bound=Kind)


def load(path: str | Path | None, kind: type[K], **overrides: object) -> K:
    """The config in the file at `path` (None: the defaults), with `overrides` (attribute
    name → value, e.g. CLI flags; None values are ignored) on top."""
    if path is None:
        return parse({"apiVersion": API_VERSION, "kind": kind.__name__}, kind, "", **overrides)
    try:
        doc = read_document(path)
    except DocumentError as e:
        raise ConfigError(str(e)) from None
    return parse(doc, kind, str(path), **overrides)


def parse(doc: object, kind: type[K], source: str, **overrides: object) -> K:
    """Validate a parsed document as `kind`; `ConfigError` names `source` and every bad key."""
    prefix = f"{source}: " if source else ""
    if doc is None:
        raise ConfigError(f"{prefix}empty; a config file starts with apiVersion and kind")
    if not isinstance(doc, dict):
        got = _WHAT.get(type(doc), type(doc).__name__)
        raise ConfigError(f"{prefix}expected a mapping with apiVersion and kind, got {got}")
    if "apiVersion" not in doc and "kind" not in doc:
        doc = kind.unversioned(doc, source or "configuration")
    _check_version(doc, kind, prefix)
    data = dict(doc)
    for name, value in overrides.items():
        if value is not None:
            data[kind.model_fields[name].alias or name] = value
    return validate(kind, data, prefix)


MAX_ROUNDS = 8  # a section nests a few deep; each round reaches one level of checks further
M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: dict[str, object], prefix: str = "") -> M:
    """`data` validated as `model`, or `ConfigError` with every problem at once. pydantic runs
    a section's cross-field checks only once its own fields are valid, so each round leaves
    out the keys that failed (their defaults stand in; a required one left out is not a new
    problem) and validates again, until no new problem shows."""
    problems: list[str] = []
    removed: set[tuple[int | str, ...]] = set()
    current = data
    for _ in range(MAX_ROUNDS):
        try:
            result = model.model_validate(current, by_alias=True, by_name=False)
        except ValidationError as e:
            errors = [
                err
                for err in e.errors(include_url=False)
                if not (err["type"] == "missing" and _under(err["loc"], removed))
            ]
            found = [p for p in problems_of(errors, model) if p not in problems]
            problems += found
            paths = {_key_path(err["loc"]) for err in errors}
            if not found or paths <= removed:
                break
            removed |= paths
            current = _without(current, paths)
        else:
            if not problems:
                return result
            break
    raise ConfigError(prefix + "; ".join(problems))


def _key_path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The key an error's location is at (a list item's: the list's)."""
    path = list(loc)
    while path and isinstance(path[-1], int):
        path.pop()
    return tuple(path)


def _under(loc: tuple[int | str, ...], paths: set[tuple[int | str, ...]]) -> bool:
    return any(loc[: len(p)] == p for p in paths)


def _without(data: dict[str, object], paths: set[tuple[int | str, ...]]) -> dict[str, object]:
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


_WHAT = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _check_version(doc: Mapping[str, object], kind: type[Kind], prefix: str) -> None:
    version, name = doc.get("apiVersion"), doc.get("kind")
    if version != API_VERSION:
        said = "missing" if version is None else f"{version!r} is not supported"
        raise ConfigError(f"{prefix}apiVersion: {said}; use {API_VERSION}")
    if name != kind.__name__:
        other = kind_named(str(name))
        hint = f" (a {name} is read by {other.read_by})" if other and other.read_by else ""
        said = "missing" if name is None else f"{name!r}"
        raise ConfigError(f"{prefix}kind: {said}; expected {kind.__name__}{hint}")


def describe(error: ValidationError, model: type[BaseModel]) -> str:
    """Every problem of a validation error as `key.path: what is wrong`, on one line."""
    return "; ".join(problems_of(error.errors(include_url=False), model))


def problems_of(errors: Sequence[Any], model: type[BaseModel]) -> list[str]:
    """Each problem of pydantic's error list as `key.path: what is wrong`, once."""
    parts = []
    for e in errors:
        loc = e["loc"]
        where = "".join(
            f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
            for i, p in enumerate(loc)
        )
        if e["type"] == "extra_forbidden":
            message = "unknown key" + _did_you_mean(model, loc)
        else:
            message = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return list(dict.fromkeys(parts))


def _did_you_mean(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """` (did you mean nodeName?)` for an unknown key, when a known one is near."""
    section = _model_at(model, loc[:-1])
    if section is None or not isinstance(loc[-1], str):
        return ""
    keys = [f.alias or n for n, f in section.model_fields.items()]
    unknown = loc[-1]
    near = [key_for(unknown)] if key_for(unknown) in keys else []  # snake_case of a key
    near = near or sorted(  # a unit spelled into the key (`window`), or a part left out
        (k for k in keys if unknown.lower().startswith(k.lower()) or k.startswith(unknown)),
        key=len,
        reverse=True,
    )
    near = near or difflib.get_close_matches(unknown, keys, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The section class at `loc` inside `model`, following fields and list items."""
    current: object = model
    for part in loc:
        if isinstance(part, int):
            current = _item_type(current)
            continue
        section = section_type(current)
        if section is None:
            return None
        field = next((f for n, f in section.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        current = field.annotation
    return section_type(current)


def section_type(annotation: object) -> type[BaseModel] | None:
    """The model class an annotation holds (`X`, `X | None`), else None."""
    for candidate in (annotation, *_optional_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _item_type(annotation: object) -> object:
    for candidate in (annotation, *_optional_args(annotation)):
        if get_origin(candidate) in (list, tuple, Sequence):
            return get_args(candidate)[0]
    return None


def _optional_args(annotation: object) -> tuple[object, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return ()


# ----------------------------------------------------------------------------- documented defaults


def render_defaults(kind: type[Kind]) -> str:
    """The kind's defaults as a YAML file, each key with its description as a comment: what
    the docs show (a test keeps the docs equal to this) and `rdmaplane config defaults` prints."""
    data = kind().model_dump(mode="json", by_alias=True)
    lines = [f"# {kind.__name__} defaults (rdmaplane config defaults {kind.__name__})"]
    return "\n".join([*lines, *_emit(kind, data, 0)]) + "\n"


def _emit(model: type[BaseModel], data: Mapping[str, Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for name, field in model.model_fields.items():
        key = field.alias or name
        value = data[key]
        comment = f"  # {field.description}" if field.description else ""
        section, item = section_type(field.annotation), section_type(_item_type(field.annotation))
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
