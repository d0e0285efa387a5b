"""The fixture corpus: outputs in the exact formats of NCCL, nccl-tests and perftest releases.

Each fixture starts with `#|` lines saying which release it mimics and where each format fact
comes from; those lines are ours, not the tool's, so `tool_output` drops them.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def tool_output(path: Path) -> str:
    """A fixture as the tool printed it: without our `#|` provenance lines."""
    lines = path.read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith("#|"))
