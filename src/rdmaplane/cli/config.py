"""`rdmaplane config`: the documented defaults of each config kind, and checking files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rdmaplane.cli.common import fail, say_error

if TYPE_CHECKING:
    from rdmaplane.adapters.config import Kind

config_app = typer.Typer(
    help="Config files: print a kind's defaults, check files before deploying them.",
    no_args_is_help=True,
)


def _kinds_help() -> str:
    from rdmaplane.adapters.config.kinds import names

    return ", ".join(names())


@config_app.command("defaults")
def defaults(
    kind: Annotated[
        str,
        typer.Argument(
            metavar="KIND",
            help="A config kind: AgentConfig, DevicePluginConfig, SchedulerExtenderConfig, "
            "WebhookConfig or RdmaDeviceConfig.",
        ),
    ],
) -> None:
    """Print KIND's defaults as a config file, every key explained (what the docs show)."""
    from rdmaplane.adapters.config import kinds, render_defaults
    from rdmaplane.cli.output import write_text

    if kind not in kinds.names():
        fail(f"unknown kind {kind!r}; one of {', '.join(sorted(kinds.names()))}")
    write_text(render_defaults(kinds.kind(kind)))


@config_app.command("validate")
def validate(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE...", help="Config files, or manifests.")
    ],
) -> None:
    """Check config files as the commands reading them would (the kind from the file; a bare
    configList is the shared RDMA plugin's format). A manifest is checked document by
    document, a ConfigMap's entries too; other objects are named and left alone. Every
    problem of a file is said at once, one line per file. Exit 2 when any is wrong, or a file
    holds no config."""
    from rdmaplane.adapters.config import ConfigError, parse
    from rdmaplane.adapters.documents import DocumentError, manifest_objects, read_documents
    from rdmaplane.cli.output import write_text
    from rdmaplane.core.untrusted import printable

    bad = 0
    for path in files:
        try:
            objects = manifest_objects(read_documents(path), str(path), bare_lists=False)
        except DocumentError as e:
            bad += 1
            say_error(str(e))
            continue
        found = [c for where, obj in objects or [(str(path), None)] for c in _configs(where, obj)]
        if all(isinstance(doc, str) for _, doc in found):
            bad += 1
            what = "; ".join(f"{where.removeprefix(str(path) + ': ')}: {d}" for where, d in found)
            say_error(f"{path}: no rdmaplane config in it ({what}); kinds: {_kinds_help()}")
            continue
        for where, doc in found:
            if isinstance(doc, str):  # not a config: what it is
                write_text(printable(f"{where}: {doc}, not a config (left alone)") + "\n")
                continue
            try:
                if isinstance(doc, DocumentError):
                    raise doc
                kind = _kind_of(doc, where)
                parse(doc, kind, where)
            except (ConfigError, DocumentError) as e:
                bad += 1
                say_error(str(e))
            else:
                write_text(printable(f"{where}: a valid {kind.name}") + "\n")
    raise typer.Exit(2 if bad else 0)


def _configs(where: str, obj: object) -> list[tuple[str, Any]]:
    """The config documents an object is or holds: itself when it is (or may be) one, a
    ConfigMap's entries that are (or the error of one that does not parse); else one
    (where, "a Kind") saying what it is."""
    from rdmaplane.adapters.config import API_VERSION
    from rdmaplane.adapters.documents import DocumentError, parse_document

    if not isinstance(obj, dict) or _may_be_config(obj):
        return [(where, obj)]
    if obj.get("kind") in _CLAIM_CONFIGS:
        return _claim_configs(where, obj) or [(where, _what(obj))]
    if obj.get("kind") != "ConfigMap":
        return [(where, _what(obj))]
    name = (obj.get("metadata") or {}).get("name", "")
    found: list[tuple[str, Any]] = []
    for key, text in (obj.get("data") or {}).items():
        at = f"{where}, ConfigMap {name} {key}"
        try:
            doc = parse_document(str(text), at)
        except DocumentError as e:
            if API_VERSION in str(text):  # a config file that does not parse
                found.append((at, e))
            continue  # not YAML: not a config file either
        if isinstance(doc, dict) and _may_be_config(doc) and doc:
            found.append((at, doc))
    return found or [(where, f"a ConfigMap ({name}) without a config file")]


# Where DRA objects keep their opaque device configuration (resource.k8s.io).
_CLAIM_CONFIGS: dict[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec", "devices", "config"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "config"),
    "DeviceClass": ("spec", "config"),
}


def _claim_configs(where: str, obj: dict[str, Any]) -> list[tuple[str, Any]]:
    """The `RdmaDeviceConfig` parameters a ResourceClaim, ResourceClaimTemplate or
    DeviceClass hands rdmaplane's DRA driver (opaque config whose driver is ours)."""
    from rdmaplane.core.settings.dra import DEFAULT_DRIVER

    node: Any = obj
    for key in _CLAIM_CONFIGS[str(obj["kind"])]:
        node = node.get(key) if isinstance(node, dict) else None
    name = (obj.get("metadata") or {}).get("name", "")
    found: list[tuple[str, Any]] = []
    for i, entry in enumerate(node if isinstance(node, list) else []):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == DEFAULT_DRIVER:
            at = f"{where}, {obj['kind']} {name} config[{i}].opaque.parameters"
            found.append((at, opaque.get("parameters")))
    return found


def _what(obj: dict[str, Any]) -> str:
    """`a DaemonSet (apps/v1)`: what an object that is no config is."""
    kind, version = obj.get("kind"), obj.get("apiVersion")
    said = f"a {kind}" if isinstance(kind, str) and kind else "an object without a kind"
    return f"{said} ({version})" if isinstance(version, str) and version else said


def _may_be_config(doc: dict[str, Any]) -> bool:
    """One of our kinds, our apiVersion, the shared plugin's configList, or no envelope at all
    (loading then says what to add)."""
    from rdmaplane.adapters.config import API_VERSION
    from rdmaplane.adapters.config.kinds import names

    version, kind = doc.get("apiVersion"), doc.get("kind")
    return (
        kind in names()
        or version == API_VERSION
        or "configList" in doc
        or (kind is None and version is None)
    )


def _kind_of(doc: object, source: str) -> Kind[Any]:
    """The kind a document says it is (a bare configList: the device plugin's; no mapping at
    all: any kind, loading says what is wrong with the shape)."""
    from rdmaplane.adapters.config import ConfigError
    from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
    from rdmaplane.adapters.config.kinds import kind, names

    named = doc.get("kind") if isinstance(doc, dict) else None
    if named in names():
        return kind(str(named))
    if not isinstance(doc, dict) or ("configList" in doc and named is None):
        return DEVICE_PLUGIN_CONFIG
    said = "missing" if named is None else repr(named)
    raise ConfigError(f"{source}: kind: {said}; one of {', '.join(sorted(names()))}")
