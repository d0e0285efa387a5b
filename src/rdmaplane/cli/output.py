"""Machine output: what a command prints for a pipe or a file (`-o json|yaml|patch|dot`, `nrt`,
`doctor job`, `config defaults`, `env`), written by a serializer straight to standard output as
UTF-8 bytes, never through the rich console (which wraps at the terminal width and would put a
line break or a space inside a value). Tables and colours are for people only.

YAML is block style, keeps text with line breaks as `|` blocks, keeps non-ASCII text as it is,
never folds a long line, and costs time linear in its input: libyaml's emitter when PyYAML was
built with it (`yaml.__with_libyaml__`), PyYAML's own otherwise (`bench/cli.py` measures both).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["json_text", "write_json", "write_text", "write_yaml", "yaml_text"]

# Never fold a line: a folded plain scalar reads back the same, but people grep and diff lines.
_NO_WRAP = 2**30


def write_text(text: str) -> None:
    """`text` on standard output, exactly: as UTF-8 bytes whatever the locale says, no
    wrapping, no markup."""
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    out.flush()
    if buffer is None:  # a stream without bytes beneath (a test's StringIO)
        out.write(text)
    else:
        buffer.write(text.encode("utf-8", "surrogateescape"))
        buffer.flush()


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """The JSON document, non-ASCII text as it is, with a final line break."""
    return json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"


def write_json(obj: Any, *, indent: int | None = 2) -> None:
    write_text(json_text(obj, indent=indent))


def _dumper() -> type[Any]:
    """A safe dumper (libyaml's emitter when there is one) that writes text with line breaks
    as `|` blocks."""
    import yaml

    base: Any = getattr(yaml, "CSafeDumper", None) if yaml.__with_libyaml__ else None
    base = base or yaml.SafeDumper

    class Dumper(base):  # type: ignore[misc]
        pass

    def text(dumper: Any, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper


_DUMPER: list[type[Any]] = []


def yaml_text(docs: Iterable[Any]) -> str:
    """The documents as one YAML stream (`---` between them), block style, keys in their
    order."""
    import yaml

    if not _DUMPER:
        _DUMPER.append(_dumper())
    text: str = yaml.dump_all(
        docs,
        Dumper=_DUMPER[0],
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=_NO_WRAP,
    )
    return text


def write_yaml(docs: Iterable[Any]) -> None:
    write_text(yaml_text(docs))
