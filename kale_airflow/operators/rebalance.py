"""RebalanceShardsOperator: the data-shuffling step before each generation of workers."""

from __future__ import annotations

from typing import Sequence

from airflow.sdk import BaseOperator


class RebalanceShardsOperator(BaseOperator):
    """Assign stream partitions to ``workers`` workers for a generation.

    Reads the partitions' current rates from the stream (or, without one, the metrics
    source) and the previous generation's
    assignment from the state store, calls the core rebalancer (sticky, balanced, slicing
    hot partitions unless ``split=False``), commits the new slices' start offsets where the
    previous generation's slices stopped (:func:`~kale_airflow.runtime.worker.handover`),
    and only then stores the result under the generation: whoever reads the assignment
    (workers, the autoscaler's backlog) finds its offsets in place.
    Idempotent: re-running for a generation that already has an assignment returns it
    unchanged. Logs imbalance, what moved and why. Returns a small summary (XCom).
    """

    template_fields: Sequence[str] = ("workers", "generation", "assignment_name")
    ui_color = "#e8f4fd"

    def __init__(self, *, workers: int | str, generation: str | None = None, assignment_name: str = "default",
                 split: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.workers = workers
        self.generation = generation
        self.assignment_name = assignment_name
        self.split = split

    def execute(self, context) -> dict:
        from kale_airflow.config import settings
        from kale_airflow.core.rebalance import RebalanceOptions, assign
        from kale_airflow.deployment import load_deployment
        from kale_airflow.metrics.embedded import open_metrics
        from kale_airflow.runtime.worker import handover
        from kale_airflow.state import StateStore
        from kale_airflow.stream import open_stream

        cfg = settings()
        dep = load_deployment(cfg)
        workers = int(self.workers)
        generation = str(self.generation or context["run_id"])
        store = StateStore(cfg.home / "state.db")
        existing = store.get(self.assignment_name, generation)
        if existing is not None:
            if existing["workers"] != workers:
                raise ValueError(
                    f"generation {generation} already has an assignment for {existing['workers']} workers, not "
                    f"{workers}; start a new generation (a new training DAG run) to change the worker count"
                )
            self.log.info("generation %s already assigned (%d workers): nothing to do", generation, workers)
            return self._summary(generation, existing, reused=True)
        stream = open_stream(dep.stream_url)
        rates = self._stream_rates(stream) or open_metrics(cfg.metrics_source, cfg.metrics_db).partition_rates()
        prev = store.latest(self.assignment_name, before=generation)
        previous = prev[1] if prev else None
        previous_doc = {"assignment": previous["assignment"]} if previous else None
        result = assign(rates, workers, previous_doc, RebalanceOptions(split=self.split))
        doc = result.to_dict(split=self.split)
        self._log_moves(prev, doc, result)
        if previous_doc and stream.partitions():
            starts = handover(stream, dep.group, previous_doc, doc)
            self.log.info("handover: %d slice(s) start where the previous generation's slices stopped: %s",
                          len(starts), ", ".join(f"{k}@{v}" for k, v in sorted(starts.items())[:20]))
        if not store.put(self.assignment_name, generation, workers, doc):  # a concurrent run won: use its result
            doc = store.get(self.assignment_name, generation)
        return self._summary(generation, doc, reused=False)

    def _stream_rates(self, stream, window_s: float = 300.0) -> dict[str, float] | None:
        """Samples/s per partition over the last ``window_s`` from the stream (every
        partition, idle ones included); None when the stream has no partitions."""
        import time

        parts = stream.partitions()
        if not parts:
            return None
        now = time.time()
        counts = stream.arrivals(now - window_s, now)
        self.log.info("partition rates from the stream over the last %.0f s", window_s)
        return {str(p): counts.get(p, 0) / window_s for p in parts}

    def _log_moves(self, prev, doc: dict, result) -> None:
        self.log.info("%d partitions over %d workers: imbalance %.4f (lower bound %.4f)", len(result.rates),
                      result.n_workers, doc["imbalance"], doc["imbalance_lower_bound"])
        if prev is None:
            self.log.info("first generation: nothing to move")
            return
        before = {p: int(w) for w, items in prev[1]["assignment"].items() for p, s in items}
        after = {p: int(w) for w, items in doc["assignment"].items() for p, s in items}
        moved = sorted(p for p in after if before.get(p) != after[p])
        self.log.info("from generation %s (%d workers): moved %.2f%% of the rate (minimum %.2f%%), %d partition(s) "
                      "changed owner: %s", prev[0], prev[1]["workers"], 100 * doc["moved_fraction"],
                      100 * doc["moved_fraction_lower_bound"], len(moved), ", ".join(moved[:20]) +
                      (" ..." if len(moved) > 20 else ""))
        for note in doc["notes"]:
            self.log.info("note: %s", note)

    @staticmethod
    def _summary(generation: str, doc: dict, reused: bool) -> dict:
        return {"generation": generation, "workers": len(doc["assignment"]), "imbalance": doc["imbalance"],
                "moved_fraction": doc["moved_fraction"], "reused": reused}
