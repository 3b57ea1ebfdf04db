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
    next task triggers. Idempotent: a decision whose target equals the running generation's
    size, or that was already applied, starts nothing (``{"skip": true}``).
    """

    template_fields: Sequence[str] = ("decision",)

    def __init__(self, *, decision, **kwargs):
        super().__init__(**kwargs)
        self.decision = decision

    def execute(self, context) -> dict:
        from kale_airflow.config import load_config
        from kale_airflow.control.generations import Generations

        return Generations(load_config(), logger=self.log).apply(dict(self.decision), context["run_id"])
