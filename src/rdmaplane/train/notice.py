"""The fault notice inside a pod: SIGTERM, or the `rdmaplane.io/fault` annotation appearing.

The rdmaplane agent annotates a pod whose RDMA device failed (`rdmaplane.io/fault`, JSON: hca,
port, class, reason, since) `fault.graceSeconds` before it evicts it; a pod that mounts its
annotations through a downward-API volume sees them as a file, which the kubelet refreshes
periodically (not instantly). The eviction then sends SIGTERM, the prompt signal. Either one
sets the notice; the training loop checks it each step, saves, and exits with `EXIT_RESTART`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

ANNOTATION = "rdmaplane.io/fault"
# "Checkpoint saved, restart me" (EX_TEMPFAIL): the example manifests' podFailurePolicy ignores
# it, so the restart costs nothing against the Job's backoffLimit.
EXIT_RESTART = 75
DEFAULT_ANNOTATIONS_FILE = "/etc/podinfo/annotations"
ENV_ANNOTATIONS_FILE = "RDMAPLANE_ANNOTATIONS_FILE"
# Set by `python -m rdmaplane.train.run`: `exit_for_restart` creates this file, so the wrapper
# can exit 75 even when a launcher (torchrun) between them reports its own code.
ENV_RESTART_FILE = "RDMAPLANE_RESTART_FILE"


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

        with FaultNotice() as notice:
            for step in range(start, steps):
                train_step(step)
                if notice:                      # or notice.is_set()
                    save_checkpoint(step + 1)
                    exit_for_restart()

    `reason` says what fired it (`SIGTERM`, or the annotation's JSON as `fault`)."""

    def __init__(
        self,
        annotations_file: str | os.PathLike[str] | None = None,
        *,
        poll_s: float = 1.0,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
    ) -> None:
        chosen = annotations_file or os.environ.get(ENV_ANNOTATIONS_FILE, DEFAULT_ANNOTATIONS_FILE)
        self.path = Path(chosen)
        self.poll_s = poll_s
        self.signals = signals
        self.reason: str | None = None
        self.fault: Mapping[str, Any] | None = None
        self._event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._seen: str | None = None
        self._warned = False

    # ---------------------------------------------------------------- state

    def is_set(self) -> bool:
        return self._event.is_set()

    __bool__ = is_set

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def fire(self, reason: str, fault: Mapping[str, Any] | None = None) -> None:
        if not self._event.is_set():
            self.reason, self.fault = reason, fault
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
        if value and value != self._seen:
            self._seen = value
            try:
                fault = json.loads(value)
            except ValueError:
                fault = {"reason": value}
            self.fire(f"annotation {ANNOTATION}", fault if isinstance(fault, dict) else None)
        return self.is_set()


def exit_for_restart() -> NoReturn:
    """Exit with `EXIT_RESTART` (75): "checkpoint saved, restart me" (and tell
    `rdmaplane.train.run`, if it started us, through its file)."""
    marker = os.environ.get(ENV_RESTART_FILE)
    if marker:
        with contextlib.suppress(OSError):
            Path(marker).touch()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(EXIT_RESTART)
