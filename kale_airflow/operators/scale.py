"""ScaleWorkersOperator: apply a scaling decision by starting a new worker generation."""

from __future__ import annotations

from typing import Sequence

from airflow.sdk import BaseOperator


class ScaleWorkersOperator(BaseOperator):
    """Turn a decision into a new generation
    (:meth:`~kale_airflow.control.generations.Generations.apply`).

    The running generation is superseded (its workers checkpoint and exit 0 when they see
    the new generation in the control store; Kubernetes pods end the same way) and the
    returned ``{"generation", "workers"}`` is the conf of the training DAG run that the
    next task triggers. One compare-and-set transaction against the generation the decision
    saw: a decision whose target equals the running generation's size, or made against a
    generation that is no longer current, starts nothing (``{"skip": true}``). Idempotent
    per decision: a retry returns the generation the first try made, with ``skip`` false
    while no training run has started it (the first try failed after applying it).

    Shadow mode (the decision says ``shadow``, the ``shadow`` argument is true, or the
    deployment's ``shadow`` switch is on; an explicit ``shadow=False`` turns it off for
    this task) starts and stops nothing: ``{"skip": true, "shadow": true, ...}``.
    """

    template_fields: Sequence[str] = ("decision", "shadow")

    def __init__(self, *, decision, shadow: bool | str | None = None, job: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.job = job  # the deployment's job (None: its only job)
        self.decision = decision
        self.shadow = shadow

    def execute(self, context) -> dict:
        from kale_airflow.config import load_config
        from kale_airflow.control.generations import Generations
        from kale_airflow.control.shadow import as_flag
        from kale_airflow.operators.failures import fail_fast

        with fail_fast():  # a broken deployment file is not retried
            config = load_config(self.job)
        decision = dict(self.decision)
        shadow = as_flag(self.shadow)
        if shadow is None:
            shadow = bool(decision.get("shadow", config.deployment.shadow))
        if shadow:
            self.log.info("shadow mode: Kale would go %s -> %s (%s); nothing started or stopped",
                          decision.get("current"), decision.get("workers"), decision.get("reason"))
            return {"skip": True, "shadow": True, "current": decision.get("current"),
                    "workers": decision.get("workers"), "reason": decision.get("reason")}
        with fail_fast():  # a database whose schema is behind waits for `kale db upgrade`, not for retries
            return Generations(config, logger=self.log).apply(decision, context["run_id"])
