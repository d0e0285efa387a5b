"""Merge the `-o json` documents many doctor pods printed into one cluster report.

A pod's log holds several documents one after another (checks, then perf), possibly with other
lines between them; every `{` at the start of a line begins a candidate document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rdmaplane.adapters.documents import MAX_DEPTH, DocumentError, check_depth
from rdmaplane.core import names
from rdmaplane.core.errors import InputError
from rdmaplane.services.doctor.policy.verdict import Status, worst

SCHEMA = names.DOCTOR_SCHEMA


class ReportError(InputError):
    """An input that holds no doctor document, named with its source."""


@dataclass(frozen=True, slots=True)
class ReportEntry:
    source: str
    node: str | None
    kind: str
    status: Status
    failed: tuple[str, ...]  # "check: detail" of every FAIL


@dataclass(frozen=True, slots=True)
class Report:
    entries: tuple[ReportEntry, ...]
    status: Status
    nodes: tuple[str, ...]


def documents(text: str, source: str = "input") -> list[dict[str, Any]]:
    """Every doctor document in `text`; other JSON and other lines are skipped. Raises
    ReportError for a doctor document nested deeper than any the doctor prints."""
    decoder = json.JSONDecoder()
    docs: list[dict[str, Any]] = []
    pos = 0
    while (start := _next_object(text, pos)) >= 0:
        try:
            doc, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        except RecursionError:
            raise ReportError(
                f"{source}: a JSON document nested deeper than {MAX_DEPTH} levels"
            ) from None
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            try:
                check_depth(doc, source)
            except DocumentError as e:
                raise ReportError(str(e)) from None
            docs.append(doc)
        pos = end
    return docs


def _next_object(text: str, pos: int) -> int:
    if pos == 0 and text.startswith("{"):
        return 0
    i = text.find("\n{", max(pos - 1, 0))
    return -1 if i < 0 else i + 1


def merge(inputs: list[tuple[str, str]]) -> Report:
    """`inputs`: (source name, text). Raises ReportError for a source with no document."""
    entries: list[ReportEntry] = []
    for source, text in inputs:
        docs = documents(text, source)
        if not docs:
            raise ReportError(f"{source}: no rdmaplane doctor -o json document in it")
        for doc in docs:
            entries.append(_entry(source, doc))
    nodes = tuple(sorted({e.node for e in entries if e.node}))
    return Report(tuple(entries), worst(e.status for e in entries), nodes)


def _entry(source: str, doc: dict[str, Any]) -> ReportEntry:
    try:
        status = Status[str(doc.get("status"))]
    except KeyError:
        status = Status.FAIL
    findings = doc.get("findings")
    failed = tuple(
        f"{f.get('name')}: {f.get('detail')}"
        for f in (findings if isinstance(findings, list) else [])
        if isinstance(f, dict) and f.get("status") == "FAIL"
    )
    node = doc.get("node") or doc.get("hostname")
    return ReportEntry(
        source, str(node) if node else None, str(doc.get("kind", "?")), status, failed
    )
