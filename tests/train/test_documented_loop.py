"""docs/faults.md shows the training loop the torch tests run: `fit` of examples/train/ddp.py,
verbatim, so the two cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "faults.md"
EXAMPLE = ROOT / "examples" / "train" / "ddp.py"
MARKER = "<!-- examples/train/ddp.py: fit, verbatim -->"


def documented_loop() -> str:
    doc = DOC.read_text()
    assert doc.count(MARKER) == 1, f"{DOC} must hold {MARKER!r} once, before the loop"
    after = doc.split(MARKER, 1)[1].lstrip("\n")
    assert after.startswith("```python\n"), f"a ```python block must follow {MARKER!r}"
    return after.removeprefix("```python\n").split("```", 1)[0]


def example_fit() -> str:
    source = EXAMPLE.read_text()
    fit = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "fit"
    )
    segment = ast.get_source_segment(source, fit)
    assert segment is not None
    return segment + "\n"


def test_the_loop_in_docs_faults_md_is_fit_of_the_example_verbatim():
    assert documented_loop() == example_fit()
