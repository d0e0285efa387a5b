"""Atomic checkpoints that a restarted job can trust: never a half-written file resumed from.

A checkpoint is one file `ckpt-<step>.rdmaplane`: a magic line, a JSON header line (step, size,
SHA-256 of the payload, free-form `meta`), then the payload bytes. It is written to a temporary
file in the same folder, fsynced, renamed over its final name (atomic on POSIX file systems) and
the folder fsynced, so after a crash the name holds either nothing or the whole file. Only the
newest `keep` are kept. Loading walks from the newest down and skips, with a
`CheckpointWarning`, any file that is torn, truncated or corrupt (size or checksum wrong).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"RDMAPLANE-CHECKPOINT 1\n"
_NAME = re.compile(r"ckpt-(\d{12})\.rdmaplane")
MAX_HEADER = 64 * 1024


class CheckpointError(OSError):
    """A checkpoint could not be written; the message names the folder and the cause. The
    previous checkpoints are untouched and no partial file is left behind."""


class CheckpointWarning(UserWarning):
    """A checkpoint file was skipped while looking for the newest valid one."""


@dataclass(frozen=True)
class Checkpoint:
    step: int
    payload: bytes
    path: Path
    meta: Mapping[str, Any] = field(default_factory=dict)


def path_for(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:012d}.rdmaplane"


def save(
    directory: str | os.PathLike[str],
    step: int,
    payload: bytes,
    *,
    keep: int = 3,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of `step` atomically and keep the newest `keep`; its path.
    Raises `CheckpointError` (one line: folder, step, cause) when it cannot be written."""
    if step < 0 or keep < 1:
        raise ValueError(f"step must be >= 0 and keep >= 1 (got step {step}, keep {keep})")
    folder = Path(directory)
    final = path_for(folder, step)
    tmp = folder / f".{final.name}.{os.getpid()}.tmp"
    header = {
        "step": step,
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "created": time.time(),
        "meta": dict(meta or {}),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n")
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(folder)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        why = e.strerror or str(e)
        raise CheckpointError(
            e.errno, f"{folder}: cannot write the checkpoint of step {step}: {why}"
        ) from e
    _prune(folder, keep)
    return final


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _steps(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint-named file, newest first."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), folder / n) for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found, reverse=True)


def _prune(folder: Path, keep: int) -> None:
    for _, path in _steps(folder)[keep:]:
        with contextlib.suppress(OSError):
            path.unlink()


def read(path: Path) -> Checkpoint:
    """One checkpoint file, verified; `ValueError` says why it cannot be trusted."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError("not an rdmaplane checkpoint (bad magic)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    if end < 0:
        raise ValueError("torn header")
    try:
        header = json.loads(data[len(MAGIC) : end])
        step, size, digest = int(header["step"]), int(header["size"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"unreadable header ({e})") from None
    payload = data[end + 1 :]
    if len(payload) != size:
        raise ValueError(f"truncated: {len(payload)} of {size} payload bytes")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("checksum mismatch")
    return Checkpoint(step, payload, path, header.get("meta") or {})


def valid(directory: str | os.PathLike[str]) -> Iterator[Checkpoint]:
    """The folder's valid checkpoints, newest first; each skipped file warns once, with why."""
    for _, path in _steps(Path(directory)):
        try:
            yield read(path)
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            warnings.warn(f"skipping checkpoint {path}: {why}", CheckpointWarning, stacklevel=2)


def latest(directory: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest valid checkpoint, or None when there is none (a fresh start)."""
    return next(valid(directory), None)


def save_object(
    directory: str | os.PathLike[str],
    step: int,
    obj: object,
    *,
    keep: int = 3,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """`save` of any picklable object (the job's own state: load only checkpoints you wrote)."""
    return save(directory, step, pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), keep=keep, meta=meta)


def load_object(directory: str | os.PathLike[str]) -> tuple[int, Any] | None:
    """(step, object) of the newest valid checkpoint written by `save_object`, or None."""
    found = latest(directory)
    return None if found is None else (found.step, pickle.loads(found.payload))
