"""Long-running asyncio tasks that never die quietly.

Every service here is a handful of endless loops (polling sysfs, publishing, staying registered
with the kubelet, watching the API server). A loop that ends on an exception nobody expected
would otherwise stop doing its job while the process, and its `/healthz`, looks fine. Each loop
runs under a `Supervisor` instead: the fault is logged with its traceback, the loop is started
again after a backoff (doubling up to a limit, reset once it has run that long without a fault),
and while it waits to be restarted it is listed in `down`, which `/healthz` reports.

Adding a task is one line: `supervisor.spawn("publish", publisher.run)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("rdmaplane.adapters.supervisor")


class Supervisor:
    """Runs named endless tasks and restarts any that fails (or returns)."""

    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        on_restart: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.on_restart = on_restart
        self.restarts: dict[str, int] = {}
        self._down: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def down(self) -> dict[str, str]:
        """Tasks waiting to be restarted, with the fault that ended them."""
        return dict(self._down)

    @property
    def names(self) -> list[str]:
        return list(self._tasks)

    def spawn(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run `run()` as task `name` until `close()`; a name is used once."""
        if name in self._tasks:
            raise ValueError(f"task {name!r} is already supervised")
        self.restarts[name] = 0
        self._tasks[name] = asyncio.create_task(self._keep(name, run), name=name)

    async def cancel(self, name: str) -> None:
        """Stop supervising task `name` (if it runs) and wait for it to end."""
        task = self._tasks.pop(name, None)
        if task is not None:
            await _cancelled(task)
        self._down.pop(name, None)

    async def close(self) -> None:
        """Cancel every task and wait for them to end."""
        for name in list(self._tasks):
            await self.cancel(name)

    async def _keep(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        delay = self.backoff_initial_s
        while True:
            started = loop.time()
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                fault = f"{type(e).__name__}: {e}"
                failed = True
            else:
                fault, failed = "ended without an error (it must run until stopped)", False
            if loop.time() - started >= self.backoff_max_s:
                delay = self.backoff_initial_s  # it ran well for a while: not a crash loop
            log.error(
                "task %s failed: %s; restarting in %g s",
                name,
                fault,
                delay,
                exc_info=failed,
                extra={"task": name, "retry_in_s": delay},
            )
            self._down[name] = fault
            self.restarts[name] += 1
            self.on_restart(name)
            try:
                await asyncio.sleep(delay)
            finally:
                self._down.pop(name, None)
            delay = min(delay * 2, self.backoff_max_s)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
