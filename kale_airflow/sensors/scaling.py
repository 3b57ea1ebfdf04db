"""ScalingSensor: waits (deferred, in the triggerer) until Kale decides a rescale is due."""

from __future__ import annotations

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from kale_airflow.control.shadow import as_flag


class ScalingSensor(BaseSensorOperator):
    """Completes with the decision (XCom) when the stabilized decision differs from the
    running worker count; the decision names the generation it saw as current
    (``current_generation``), which applying it compares and swaps. ``deferrable=True``
    (default) polls in the triggerer; otherwise each poke is one observation and decision.
    ``max_polls`` bounds one deferral; the sensor then completes with a hold so the next
    DAG run continues (state persists). ``job``: the deployment's job it scales (None: its
    only job)."""

    template_fields = ("poll_interval_s", "max_polls", "shadow")

    def __init__(self, *, poll_interval_s: float | str = 15.0, max_polls: int | str = 240, deferrable: bool = True,
                 shadow: bool | str | None = None, job: str | None = None, **kwargs):
        # poll_interval_s may be a template (rendered at run time); the poke interval needs a number now.
        kwargs.setdefault("poke_interval", poll_interval_s if isinstance(poll_interval_s, (int, float)) else 15.0)
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s
        self.max_polls = max_polls
        self.deferrable = deferrable
        self.shadow = shadow  # None or "None": as configured; may be a template ("{{ params.shadow }}")
        self.job = job
        self._autoscaler = None

    def execute(self, context):
        from kale_airflow.config import load_config
        from kale_airflow.operators.failures import fail_fast

        with fail_fast():  # a broken deployment file fails here, once, not in the triggerer with retries
            load_config(self.job)
        if self.deferrable:
            from kale_airflow.triggers.scaling import ScalingTrigger

            self.defer(trigger=ScalingTrigger(float(self.poll_interval_s), int(self.max_polls),
                                              as_flag(self.shadow), self.job),
                       method_name="execute_complete")
        return super().execute(context)

    def poke(self, context) -> PokeReturnValue:
        from kale_airflow.control.generations import decision_event

        if self._autoscaler is None:
            from kale_airflow.control.autoscaler import Autoscaler

            self._autoscaler = Autoscaler.from_environment(as_flag(self.shadow), self.job)
        return PokeReturnValue(*decision_event(self._autoscaler))

    def execute_complete(self, context, event: dict) -> dict:
        self.log.info("%sdecision: %s -> %s (%s): %s", "shadow " if event.get("shadow") else "", event["current"],
                      event["workers"], event["reason"], event["message"])
        return event

