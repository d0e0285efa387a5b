"""The fault notice inside a pod: SIGTERM, or the `rdmaplane.io/fault` annotation appearing.

The rdmaplane agent annotates a pod whose RDMA device failed (`rdmaplane.io/fault`, JSON: hca,
port, class, reason, since; the contract both sides use is `rdmaplane.core.notice`)
`fault.graceSeconds` before it evicts it; a pod that mounts its annotations through a
downward-API volume sees them as a file, which the kubelet refreshes periodically (not
instantly). The eviction then sends SIGTERM, the prompt signal. Either one
sets the notice; the training loop checks it each step, saves, and exits with `EXIT_RESTART`.

The annotation stays on the pod while the fault lasts, so a worker restarted in the same pod
(torchrun `--max-restarts` under `fault.action: notify`) finds it again. A notice is known by
its fault (`notice_id`: HCA, port, class, since); the checkpoint records the ones it answered
(`FaultNotice.answered`), and a notice constructed with them fires only for a new fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

# The notice's key, its document and its identity: the contract the agent writes by.
from rdmaplane.core.notice import (
    ANNOTATION,
    ANNOTATIONS_FILE,
    ANNOTATIONS_FILE_ENV,
    document,
    notice_id,
)

# "Checkpoint saved, restart me" (EX_TEMPFAIL): the example manifests' podFailurePolicy ignores
# it, so the restart costs nothing against the Job's backoffLimit.
EXIT_RESTART = 75
# Set by `python -m rdmaplane.train.run`: the name of its abstract Unix socket (`@name`), where
# `exit_for_restart` says so, and the wrapper can exit 75 even when a launcher (torchrun)
# between them reports its own code. Abstract: nothing on disk for a killed wrapper to leave.
ENV_RESTART_SOCKET = "RDMAPLANE_RESTART_SOCKET"


class NoticeWarning(UserWarning):
    """The annotation file is missing or unreadable: only SIGTERM can signal a fault."""


def parse_annotations(text: str) -> dict[str, str]:
    """The downward API's `metadata.annotations` file: one `key="value"` per line, the value
    quoted Go-style (escapes as in JSON for what annotations hold)."""
    out = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(quoted)
        except ValueError:
            value = quoted.strip('"')
        if isinstance(value, str):
            out[key.strip()] = value
    return out


class FaultNotice:
    """Set once a fault is announced. Use as a context manager (or `start()`/`stop()`) from
    the main thread (signal handlers can only be installed there):

        with FaultNotice(answered=resumed_checkpoint_answered) as notice:
            for step in range(start, steps):
                train_step(step)
                if notice:                      # or notice.is_set()
                    save_checkpoint(step + 1, answered=notice.answered)
                    exit_for_restart()

    `reason` says what fired it (`SIGTERM`, or the annotation's JSON as `fault`). An annotation
    whose `notice_id` is in `answered` (what the checkpoint resumed from answered) does not
    fire; a different one does."""

    def __init__(
        self,
        annotations_file: str | os.PathLike[str] | None = None,
        *,
        poll_s: float = 1.0,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
        answered: Iterable[str] = (),
    ) -> None:
        chosen = annotations_file or os.environ.get(ANNOTATIONS_FILE_ENV, ANNOTATIONS_FILE)
        self.path = Path(chosen)
        self.poll_s = poll_s
        self.signals = signals
        self.reason: str | None = None
        self.fault: Mapping[str, Any] | None = None
        self.fired_id: str | None = None
        self._answered_before = frozenset(answered)
        self._current_id: str | None = None
        self._event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._seen: str | None = None
        self._warned = False

    @property
    def answered(self) -> frozenset[str]:
        """The notices a checkpoint saved now answers: the one that fired, and those answered
        before that are still in the file (a cleared one never comes back: a new fault has a
        new `since`), so the record stays as small as the faults present."""
        still = self._answered_before & {self._current_id}
        return frozenset(still | ({self.fired_id} if self.fired_id else set()))

    # ---------------------------------------------------------------- state

    def is_set(self) -> bool:
        return self._event.is_set()

    __bool__ = is_set

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def fire(
        self, reason: str, fault: Mapping[str, Any] | None = None, fired_id: str | None = None
    ) -> None:
        if not self._event.is_set():
            self.reason, self.fault, self.fired_id = reason, fault, fired_id
            print(f"rdmaplane.train: fault notice ({reason})", file=sys.stderr, flush=True)
        self._event.set()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FaultNotice:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self.check()
        self._thread = threading.Thread(target=self._watch, name="fault-notice", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> FaultNotice:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.fire(signal.Signals(signum).name)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def check(self) -> bool:
        """Read the annotation file once; fires when `rdmaplane.io/fault` appeared or changed."""
        try:
            text = self.path.read_text()
        except OSError as e:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"{self.path}: {e.strerror or e}: mount the pod's annotations there with "
                    "a downward-API volume (docs/faults.md); until then only SIGTERM signals "
                    "a fault",
                    NoticeWarning,
                    stacklevel=2,
                )
            return self.is_set()
        value = parse_annotations(text).get(ANNOTATION)
        self._current_id = notice_id(value) if value else None
        if value and value != self._seen:
            self._seen = value
            if self._current_id in self._answered_before:
                print(
                    f"rdmaplane.train: fault notice {self._current_id} was answered by the "
                    "checkpoint resumed from; waiting for a new one",
                    file=sys.stderr,
                    flush=True,
                )
                return self.is_set()
            reason = f"annotation {ANNOTATION}"
            self.fire(reason, document(value), self._current_id)
        return self.is_set()


def exit_for_restart() -> NoReturn:
    """Exit with `EXIT_RESTART` (75): "checkpoint saved, restart me" (and tell
    `rdmaplane.train.run`, if it started us, through its socket)."""
    name = os.environ.get(ENV_RESTART_SOCKET, "")
    if name.startswith("@"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(str(EXIT_RESTART).encode(), "\0" + name[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(EXIT_RESTART)
