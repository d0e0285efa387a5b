"""The downward-API annotations file as the kubelet writes it, for the notice tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

FAULT = {
    "class": "fatal",
    "hca": "mlx5_3",
    "port": 1,
    "reason": "port 1 DOWN (DISABLED)",
    "since": "2026-11-30T13:00:00Z",
}


def kubelet_format(annotations: dict[str, str]) -> str:
    """What the kubelet writes for `metadata.annotations`: sorted `key="value"` lines, the
    value quoted like Go's %q (for ASCII JSON the same as a JSON string)."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(annotations.items()))


def write_like_kubelet(path: Path, annotations: dict[str, str]) -> None:
    """Atomic replacement, as the kubelet's atomic writer swaps its `..data` link."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(kubelet_format(annotations))
    os.replace(tmp, path)
