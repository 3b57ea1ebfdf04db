"""Champion promotions: announced as Airflow Asset events, and the autoscaler's cheap check for them.

A retrain or refit that promotes its challenger ends with an ``announce_champion`` task whose
outlet is the model's Asset (``kale://models/forecaster``, ``kale://models/throughput``):
Airflow records an asset event (extra: model and version) that the DAG graph and the asset
views show and that other DAGs can be scheduled on. The same task writes the promotion to
the control-plane database. The autoscaler (a deferred trigger, which never sees
``inlet_events``) reads that one row at each poke and asks MLflow for the champion aliases
only when it changed, or after ``RECHECK_S`` (an alias moved by hand in the MLflow UI is
announced by no task), instead of asking MLflow for both aliases on every poke.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, THROUGHPUT_MODEL

ASSET_URIS = {FORECASTER_MODEL: "kale://models/forecaster", THROUGHPUT_MODEL: "kale://models/throughput"}
PROMOTION_KEY = "champions/last_promotion"
RECHECK_S = 600.0  # the registry is still asked this often, for promotions made in the MLflow UI


def announce(store, result: dict, model: str, now: float | None = None) -> dict | None:
    """Record a promote-or-hold ``result`` that promoted ``model``; returns the asset event's
    extra (model, version, time), or None when the challenger was held (nothing to announce)."""
    if not result.get("promoted"):
        return None
    extra = {"model": model, "version": str(result["version"]), "promoted_at": time.time() if now is None else now}
    store.set_value(PROMOTION_KEY, extra)
    return extra


class AnnouncedChampions:
    """A champion source (``versions()``/``load()``) that asks the wrapped registry for the
    champion versions only when a promotion was announced since it last asked, when it has
    no complete answer yet, or every ``recheck_s``; otherwise it repeats its last answer."""

    def __init__(self, source, store, recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic):
        self.source, self.store, self.recheck_s, self.clock = source, store, recheck_s, clock
        self._versions: tuple[str | None, str | None] | None = None
        self._announced: dict | None = None
        self._asked_at = -math.inf

    def versions(self) -> tuple[str | None, str | None]:
        announced = self.store.get_value(PROMOTION_KEY)
        if (self._versions is None or None in self._versions or announced != self._announced
                or self.clock() - self._asked_at >= self.recheck_s):
            self._versions = self.source.versions()  # may raise (MLflow down): asked again next poke
            self._announced, self._asked_at = announced, self.clock()
        return self._versions

    def load(self) -> tuple:
        return self.source.load()
