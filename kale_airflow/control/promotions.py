"""Champion promotions: announced as Airflow Asset events, and the autoscaler's cheap check for them.

A retrain or refit that promotes its challenger ends with an ``announce_champion`` task whose
outlet is the model's Asset (``kale://models/forecaster``, ``kale://models/throughput``):
Airflow records an asset event (extra: model and version) that the DAG graph and the asset
views show and that other DAGs can be scheduled on. The same task writes the promotion to
the control-plane database. The autoscaler (a deferred trigger, which never sees
``inlet_events``) reads that one row at each poke and asks MLflow for the champion aliases
only when it changed, or after ``RECHECK_S`` (an alias moved by hand in the MLflow UI is
announced by no task), instead of asking MLflow for both aliases on every poke.

Each fresh answer can be handed to ``on_answer``: :class:`ManualApprovals` tags a champion
whose alias was moved by hand ``kale.review=approved-manually`` (MLflow records no approver
for an alias move; ``kale promote`` records one).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, THROUGHPUT_MODEL, job_of_model

log = logging.getLogger(__name__)
MODELS = (FORECASTER_MODEL, THROUGHPUT_MODEL)  # the order of a champion source's versions()

ASSET_URIS = {FORECASTER_MODEL: "kale://models/forecaster", THROUGHPUT_MODEL: "kale://models/throughput"}


def asset_uri(model: str) -> str:
    """The Asset announcing ``model``'s champions: ``kale://models/forecaster`` (or
    ``throughput``) for the default job's models, ``.../<job>`` for another job's
    (``kale-traffic-forecaster-<job>``)."""
    job = job_of_model(model)
    for base, uri in ASSET_URIS.items():
        if job is not None and model.startswith(base):
            return uri if job == DEFAULT_JOB else f"{uri}/{job}"
    raise KeyError(f"{model!r} is not a kale model; expected {' or '.join(ASSET_URIS)} (with -<job> for a job)")


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
    no complete answer yet, or every ``recheck_s``; otherwise it repeats its last answer.
    ``on_answer`` (e.g. :class:`ManualApprovals`) is called with every fresh answer."""

    def __init__(self, source, store, recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic,
                 on_answer: Callable[[tuple], None] | None = None):
        self.source, self.store, self.recheck_s, self.clock = source, store, recheck_s, clock
        self.on_answer = on_answer
        self._versions: tuple[str | None, str | None] | None = None
        self._announced: dict | None = None
        self._asked_at = -math.inf

    def versions(self) -> tuple[str | None, str | None]:
        announced = self.store.get_value(PROMOTION_KEY)
        if (self._versions is None or None in self._versions or announced != self._announced
                or self.clock() - self._asked_at >= self.recheck_s):
            self._versions = self.source.versions()  # may raise (MLflow down): asked again next poke
            self._announced, self._asked_at = announced, self.clock()
            if self.on_answer is not None:
                self.on_answer(self._versions)
        return self._versions

    def load(self) -> tuple:
        return self.source.load()


def unchecked(versions: tuple, checked: dict[str, str], models: tuple = MODELS) -> list[tuple[str, str, str | None]]:
    """``(model, champion version, champion checked before it)`` for each champion in
    ``versions`` (ordered as ``models``: a job's forecaster, then its throughput model)
    whose approval is not yet known to be on record."""
    return [(name, str(v), checked.get(name)) for name, v in zip(models, versions)
            if v is not None and checked.get(name) != str(v)]


class ManualApprovals:
    """``on_answer`` of :class:`AnnouncedChampions` for the autoscaler: each champion it has not
    checked yet is looked up once, and tagged ``approved-manually`` (and the champion seen
    before it superseded) when Kale did not approve it
    (:func:`~kale_airflow.registry.mlflow_registry.record_manual_approval`).

    A failure (MLflow down, a read-only token) is logged and the check repeated with the next
    answer; it never stops a decision. Not for dry runs: it writes tags."""

    def __init__(self, uri: str, clock: Callable[[], float] = time.time, models: tuple = MODELS):
        self.uri, self.clock, self.models = uri, clock, models
        self.checked: dict[str, str] = {}  # model -> the champion version whose approval is on record

    def __call__(self, versions: tuple) -> None:
        from kale_airflow.registry.mlflow_registry import record_manual_approval, registry_client
        from kale_airflow.store.database import masked

        for name, version, previous in unchecked(versions, self.checked, self.models):
            try:
                if record_manual_approval(registry_client(self.uri), name, version, previous, self.clock()):
                    log.warning("%s v%s became champion outside kale (the alias was moved by hand): tagged "
                                "kale.review=approved-manually; `kale promote` records who approves", name, version)
                self.checked[name] = version
            except Exception as exc:  # noqa: BLE001 - bookkeeping must never stop the autoscaler
                log.warning("could not check how %s v%s became champion (%s); checking again at the next answer",
                            name, version, masked(exc))
