"""The words every doctor result is made of: a status, a finding with its one-line fix."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rdmaplane.core.errors import InputError

# mpirun --tag-output `[1,0]<stdout>:`, srun --label `0: `, torchrun `[default0]:` and
# `[rank0]:`, kubectl logs --prefix `[pod/name/container] `
_LAUNCHER = re.compile(
    r"^\s*(?:\[\d+,\d+\]<(?:stdout|stderr)>:\s?|\d+:\s|\[(?:default|rank)\d+\]:\s?"
    r"|\[(?:pod|deployment|job|statefulset)/[^\]\s]+\]\s)"
)


class Status(enum.IntEnum):
    """Ordered so that the worst of several is their `max`. SKIP: looked at, not judged (a
    single-node run says nothing about the NICs); it never hides a PASS, WARN or FAIL."""

    SKIP = -1
    PASS = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True, slots=True)
class Finding:
    """One check or diagnosis: what was looked at, what it found, and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, default=Status.PASS)


def exit_code(status: Status) -> int:
    """0 pass (warnings included), 1 fail; 2 is left to usage errors."""
    return 1 if status == Status.FAIL else 0


class ParseError(InputError):
    """Text that is not the output it was said to be; names the line that gave up."""

    def __init__(self, what: str, reason: str, line_no: int | None = None, line: str = "") -> None:
        self.what = what
        self.reason = reason
        self.line_no = line_no
        self.line = line
        where = f" at line {line_no}: {line.strip()[:80]!r}" if line_no is not None else ""
        super().__init__(f"could not parse {what}: {reason}{where}")


def jsonable(value: Any) -> Any:
    """Dataclasses, enums and tuples as plain JSON values (enums by name)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name if isinstance(value, Status) else value.value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def strip_launcher_prefix(line: str) -> str:
    """Drop what launchers put before each line: mpirun (`[1,0]<stdout>:`), srun --label
    (`0: `), torchrun (`[default0]:`, `[rank0]:`), kubectl logs --prefix (`[pod/x/c] `); up to
    three, when one runs inside another."""
    for _ in range(3):
        m = _LAUNCHER.match(line)
        if not m:
            break
        line = line[m.end() :]
    return line
