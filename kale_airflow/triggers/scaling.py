"""ScalingTrigger: poll the autoscaler in the triggerer until a change is due."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent


class ScalingTrigger(BaseTrigger):
    """Every ``poll_interval_s``, observe and decide; fire when the decided worker count
    differs from the running one, or after ``max_polls`` with the last hold (the event of
    :func:`~kale_airflow.control.generations.decision_event`).

    ``shadow`` (None: as configured) decides and records without ever applying; the
    event then says ``"shadow": true`` and the scale task starts nothing.

    Serializes primitives only (the triggerer rebuilds it from this dict)."""

    def __init__(self, poll_interval_s: float = 15.0, max_polls: int = 240, shadow: bool | None = None,
                 job: str | None = None):
        super().__init__()
        self.job = job  # the deployment's job (None: its only job)
        self.poll_interval_s = float(poll_interval_s)
        self.max_polls = int(max_polls)
        self.shadow = None if shadow is None else bool(shadow)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("kale_airflow.triggers.scaling.ScalingTrigger",
                {"poll_interval_s": self.poll_interval_s, "max_polls": self.max_polls, "shadow": self.shadow,
                 "job": self.job})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from kale_airflow.control.autoscaler import Autoscaler
        from kale_airflow.control.generations import decision_event

        autoscaler = await asyncio.to_thread(Autoscaler.from_environment, self.shadow, self.job)
        event = None
        for i in range(self.max_polls):
            done, event = await asyncio.to_thread(decision_event, autoscaler)
            if done:
                yield TriggerEvent(event)
                return
            if i + 1 < self.max_polls:
                await asyncio.sleep(self.poll_interval_s)
        yield TriggerEvent(event)  # the last hold
