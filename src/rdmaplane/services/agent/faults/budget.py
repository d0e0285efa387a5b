"""The fleet's word on this node's fault actions: before an eviction or a NoExecute taint the
actor asks the fault budget (the blast-radius breaker, `rdmaplane.services.agent.breaker`) for a
token; refused, the pods wait and their notices say why. A token held is used for a taint until
it ends; an eviction asks again, so a token taken just before a storm was seen does not outlive
the storm; a refusal is asked again after `retry_s`."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from rdmaplane.core.breaker import Answer, BudgetVerdict, Change
from rdmaplane.core.faults import Decision, Verb
from rdmaplane.services.agent.breaker import FaultBudget
from rdmaplane.services.agent.metrics import FaultMetrics

log = logging.getLogger(__package__)


class BudgetTokens:
    def __init__(
        self,
        budget: FaultBudget | None,
        mode: str,
        retry_s: float,
        metrics: FaultMetrics,
        on_change: Callable[[Change], Awaitable[object]],
        clock: Callable[[], float],
    ) -> None:
        self.budget = budget  # None: no fault budget (breaker off, or no API server)
        self.mode = mode
        self.retry_s = retry_s
        self.metrics = metrics
        self._on_change = on_change
        self._clock = clock
        self._answer: tuple[float, Answer] | None = None  # the last, and when (monotonic)
        self._token_until = -float("inf")  # wall clock

    async def ask(self, wanted: Sequence[Decision], new_noexecute: bool) -> Answer | None:
        """The budget's word for this round: a token when an act or a NoExecute taint is due,
        else, when a notice goes out, whether a storm holds the node."""
        evicting = any(d.verb == Verb.ACT for d in wanted)
        acting = new_noexecute or evicting
        if self.budget is None:
            return Answer(BudgetVerdict.GRANTED, "no fault budget") if acting else None
        if not acting:
            if any(d.verb == Verb.NOTIFY for d in wanted):
                peeked = await self.budget.peek()
                return self._said(peeked) if peeked is not None else None
            return None
        if time.time() < self._token_until and not evicting:
            return Answer(BudgetVerdict.GRANTED, "token held", self._token_until)
        now = self._clock()
        if self._answer is not None and now - self._answer[0] < self.retry_s:
            return self._said(self._answer[1])
        answer, changes = await self.budget.take()
        self._answer = (now, answer)
        self.metrics.breaker_answers.labels(answer.verdict.value).inc()
        self.metrics.breaker_open.set(1 if answer.storming else 0)
        if answer.verdict == BudgetVerdict.GRANTED and answer.until is not None:
            self._token_until = answer.until
            self._answer = None
        for change in changes:
            await self._on_change(change)
        if answer.verdict != BudgetVerdict.GRANTED:
            log.warning("fault budget: %s: %s", answer.verdict.value, answer.why)
        return self._said(answer)

    def _said(self, answer: Answer) -> Answer:
        """In `observe` mode a refusal is only said: the act goes ahead, the notice holds
        nothing."""
        if self.mode == "observe" and answer.verdict != BudgetVerdict.GRANTED:
            return Answer(BudgetVerdict.GRANTED, f"observe mode, would hold: {answer.why}")
        return answer
