"""No one-letter import aliases under src/ (`faults as F`): a reader of `F.step` has to scroll up
to learn what it is. The generated gRPC modules (kubelet/api) are protoc's, not ours."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
GENERATED = SRC / "kubelet" / "api"


def one_letter_aliases(text: str) -> list[str]:
    return [
        f"l.{node.lineno}: {alias.name} as {alias.asname}"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if alias.asname is not None and len(alias.asname) == 1
    ]


def test_the_check_sees_both_kinds_of_import() -> None:
    text = "import numpy as n\nfrom rdmaplane import (\n    faults as F,\n    nrt as nrtlib,\n)\n"
    assert one_letter_aliases(text) == ["l.1: numpy as n", "l.2: faults as F"]


def test_no_one_letter_import_aliases() -> None:
    found = {
        str(path.relative_to(SRC)): hits
        for path in SRC.rglob("*.py")
        if GENERATED not in path.parents and (hits := one_letter_aliases(path.read_text()))
    }
    assert not found, f"one-letter import aliases: {found}"
