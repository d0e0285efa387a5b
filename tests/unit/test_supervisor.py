"""The supervisor of long tasks: faults are logged, tasks restarted with backoff, and `down`
says which task is waiting to run again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rdmaplane.adapters.supervisor import Supervisor


class Flaky:
    """A long task that fails while `broken` is set, else runs until cancelled."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.starts = 0
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.starts += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError(f"boom {self.starts}")
        self.running.set()
        await asyncio.Event().wait()


async def until(check, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_a_failing_task_is_logged_listed_down_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen_down: list[dict[str, str]] = []
    tasks = Supervisor(
        backoff_initial_s=0.2,
        backoff_max_s=1.0,
        on_restart=lambda name: seen_down.append(tasks.down),
    )
    task = Flaky(failures=2)
    try:
        tasks.spawn("worker", task.run)
        await asyncio.wait_for(task.running.wait(), 10)
        assert seen_down == [{"worker": "RuntimeError: boom 1"}, {"worker": "RuntimeError: boom 2"}]
        assert task.starts == 3 and not tasks.down  # up again: no longer listed
        assert tasks.restarts == {"worker": 2}
    finally:
        await tasks.close()
    faults = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in faults] == [
        "task worker failed: RuntimeError: boom 1; restarting in 0.2 s",
        "task worker failed: RuntimeError: boom 2; restarting in 0.4 s",  # backing off
    ]
    assert faults[0].exc_info is not None  # the traceback, for the bug report


async def test_a_task_that_returns_is_restarted_too() -> None:
    calls = 0

    async def returns() -> None:
        nonlocal calls
        calls += 1

    tasks = Supervisor(backoff_initial_s=0.01, backoff_max_s=0.02)
    try:
        tasks.spawn("quitter", returns)
        await until(lambda: calls >= 3)
        assert tasks.restarts["quitter"] >= 2
    finally:
        await tasks.close()


async def test_cancel_and_close_end_the_tasks() -> None:
    tasks = Supervisor()
    a, b = Flaky(), Flaky()
    tasks.spawn("a", a.run)
    tasks.spawn("b", b.run)
    with pytest.raises(ValueError, match="already supervised"):
        tasks.spawn("a", a.run)
    await asyncio.wait_for(asyncio.gather(a.running.wait(), b.running.wait()), 10)
    await tasks.cancel("a")
    assert tasks.names == ["b"]
    await tasks.close()
    assert tasks.names == [] and not tasks.down
