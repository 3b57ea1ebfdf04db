"""RebalanceShardsOperator: the data-shuffling step before each generation of workers."""

from __future__ import annotations

from typing import Sequence

from airflow.sdk import BaseOperator


class RebalanceShardsOperator(BaseOperator):
    """Assign stream partitions to ``workers`` workers for a generation
    (:meth:`~kale_airflow.control.generations.Generations.rebalance`): balanced, sticky,
    hot partitions sliced unless ``split=False``; new slices' start offsets are committed
    before the assignment is published. Idempotent per generation. Logs imbalance, what
    moved and why; returns a small summary (XCom). ``job``: the deployment's job whose
    stream and generations these are (None: its only job)."""

    template_fields: Sequence[str] = ("workers", "generation", "assignment_name")
    ui_color = "#e8f4fd"

    def __init__(self, *, workers: int | str, generation: str | None = None, assignment_name: str = "default",
                 split: bool = True, job: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.job = job
        self.workers = workers
        self.generation = generation
        self.assignment_name = assignment_name
        self.split = split

    def execute(self, context) -> dict:
        from kale_airflow.config import load_config
        from kale_airflow.control.generations import Generations

        generations = Generations(load_config(self.job), logger=self.log)
        return generations.rebalance(str(self.generation or context["run_id"]), int(self.workers), self.split,
                                     self.assignment_name)
