"""ScaleWorkersOperator: apply a scaling decision by starting a new worker generation."""

from __future__ import annotations

import time
from typing import Sequence

from airflow.sdk import BaseOperator


class ScaleWorkersOperator(BaseOperator):
    """Turn a decision into a new generation.

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
        from kale_airflow.config import settings
        from kale_airflow.state import StateStore

        d = self.decision if isinstance(self.decision, dict) else dict(self.decision)
        store = StateStore(settings().home / "state.db")
        cur = store.current()
        target = int(d["workers"])
        key = f"{d.get('current')}->{target}@{context['run_id']}"
        applied = store.get_value("last_applied") or {}
        if d.get("status") != "scale" or (cur and cur["workers"] == target) or applied.get("key") == key:
            self.log.info("nothing to apply (%s): %s workers running, decision %s", d.get("status"),
                          cur["workers"] if cur else 0, target)
            return {"skip": True, "workers": target, "generation": cur["generation"] if cur else None}
        generation = f"g{int(time.time())}-{target}w"
        self.log.info("scaling %s -> %d workers (%s): %s; new generation %s", cur["workers"] if cur else 0, target,
                      d.get("reason"), d.get("message"), generation)
        store.set_current_generation(generation, target)
        store.set_value("last_applied", {"key": key, "generation": generation})
        return {"skip": False, "workers": target, "generation": generation}
