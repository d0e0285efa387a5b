"""New lines of the kernel log, read without blocking: `/dev/kmsg` (one record per read) or a
syslog file the host writes (`/var/log/kern.log`), from where it ends when first opened.

Recognised lines become `rdmaplane.core.kernellog.KernelEvent`s, kept for `keep_s`. On `/dev/kmsg`
a reader that fell behind the ring buffer gets EPIPE once and goes on from the oldest record
left; a file that shrank (rotated, truncated) is read again from its start. A log that cannot
be opened is said once and tried again at every read.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from rdmaplane.core.kernellog import KernelEvent, recognise

log = logging.getLogger("rdmaplane.adapters.discovery.kernellog")
READ_SIZE = 8192  # a kmsg record is at most 1 KiB of text (plus its dictionary lines)
MAX_READS = 4096  # per call: a flood of log lines cannot hold the poll for long


class KernelLog:
    def __init__(
        self, path: Path, keep_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.keep_s = keep_s
        self._clock = clock
        self._fd: int | None = None
        self._records = False  # /dev/kmsg: every read is one record
        self._partial = b""
        self._offset = 0
        self._problem: str | None = None
        self.events: tuple[KernelEvent, ...] = ()

    def read(self) -> tuple[KernelEvent, ...]:
        """The events of the last `keep_s`, with what was logged since the last call."""
        now = self._clock()
        found = [e for line in self._new_lines() if (e := recognise(line, now)) is not None]
        self.events = tuple(e for e in (*self.events, *found) if now - e.at < self.keep_s)
        return self.events

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _new_lines(self) -> list[str]:
        if self._fd is None and not self._open():
            return []
        assert self._fd is not None
        if not self._records and os.fstat(self._fd).st_size < self._offset:
            os.lseek(self._fd, 0, os.SEEK_SET)  # rotated or truncated: from its start
            self._offset, self._partial = 0, b""
        chunks = []
        for _ in range(MAX_READS):
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten before we read them: go on
                    continue
                self._say(f"{self.path}: {e.strerror}")
                self.close()
                break
            if not data:
                break
            self._offset += len(data)
            chunks.append(data)
        if self._records:
            return [c.decode("utf-8", "replace") for c in chunks]
        text = self._partial + b"".join(chunks)
        *lines, self._partial = text.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self._say(f"cannot read the kernel log {self.path}: {e.strerror}")
            return False
        self._records = stat.S_ISCHR(os.fstat(fd).st_mode)
        self._offset = os.lseek(fd, 0, os.SEEK_END)  # what is logged from now on
        self._fd, self._partial = fd, b""
        if self._problem is not None:
            log.info("reading the kernel log %s again", self.path)
            self._problem = None
        return True

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            log.warning("%s; mlx5 health events are not seen meanwhile", problem)
            self._problem = problem
