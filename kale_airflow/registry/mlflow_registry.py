"""Registry workflow shared by both models.

A new version gets the alias ``challenger``. It is compared with ``champion`` on the same
recent window; it becomes ``champion`` when auto-promotion is on and it wins (or there is
no champion yet). Otherwise it is tagged ``kale.review = pending`` with the comparison in
its description, and a reviewer promotes it in the MLflow UI by moving the ``champion``
alias. Decisions are tagged on the version so the UI shows why.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass

from kale_airflow.core.errors import KaleError

log = logging.getLogger(__name__)

FORECASTER_MODEL = "kale-traffic-forecaster"
THROUGHPUT_MODEL = "kale-throughput-model"
CHAMPION, CHALLENGER = "champion", "challenger"


class RegistryUnavailable(KaleError, RuntimeError):
    """MLflow cannot be reached or refused the request; nothing was changed."""


@contextmanager
def mlflow_at(uri: str, artifact_root: str | None = None):
    """Point MLflow at ``uri`` and fail fast (no minutes of retries) when it is down."""
    import mlflow
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        client = MlflowClient(uri, uri)
        try:
            client.search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - any failure here means "unreachable"
            raise RegistryUnavailable(
                f"MLflow at {uri} is unreachable ({type(exc).__name__}: {str(exc)[:200]}); "
                "start the tracking server or fix KALE_MLFLOW_URI. No model or alias was changed."
            ) from exc
        if artifact_root and mlflow.get_experiment_by_name("kale") is None:
            mlflow.create_experiment("kale", artifact_location=artifact_root)
        mlflow.set_experiment("kale")
        yield client
    finally:
        mlflow.set_tracking_uri(previous)


@dataclass(frozen=True)
class Review:
    """Outcome of a challenger/champion comparison."""

    version: str
    promoted: bool
    reason: str
    champion_version: str | None
    comparison: dict

    def to_dict(self) -> dict:
        """JSON/XCom form."""
        return {"version": self.version, "promoted": self.promoted, "reason": self.reason,
                "champion_version": self.champion_version, "comparison": self.comparison}


def current_version(client, name: str, alias: str) -> str | None:
    """Version behind an alias, or None."""
    try:
        return client.get_model_version_by_alias(name, alias).version
    except Exception:  # noqa: BLE001 - MLflow raises a generic RestException for a missing alias
        return None


def register(client, name: str, run_id: str, artifact_path: str, description: str) -> str:
    """Register the run's model as a new version with alias ``challenger``."""
    import mlflow

    try:
        client.get_registered_model(name)
    except Exception:  # noqa: BLE001
        client.create_registered_model(name, description=description)
    mv = mlflow.register_model(f"runs:/{run_id}/{artifact_path}", name)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return str(mv.version)


def review(client, name: str, version: str, challenger_score: float, champion_score: float | None,
           metric: str, auto_promote: bool, comparison: dict) -> Review:
    """Promote or hold the challenger (lower ``metric`` is better), tag and describe it."""
    champion = current_version(client, name, CHAMPION)
    if champion_score is None or champion is None:
        wins, why = True, "no champion yet"
    else:
        wins = challenger_score < champion_score
        why = f"{metric} {challenger_score:.4g} vs champion v{champion} {champion_score:.4g}"
    table = "\n".join(f"| {k} | {v} |" for k, v in comparison.items())
    text = f"Challenger v{version}: {why}.\n\n| metric | value |\n| --- | --- |\n{table}\n"
    if wins and auto_promote:
        client.set_registered_model_alias(name, CHAMPION, version)
        client.set_model_version_tag(name, version, "kale.review", "promoted")
        reason = f"promoted automatically: {why}"
    else:
        client.set_model_version_tag(name, version, "kale.review", "pending")
        reason = (f"held for review: {why}" + ("" if wins else " (the challenger does not win)")
                  + "; move the 'champion' alias in the MLflow UI to promote it")
    client.set_model_version_tag(name, version, "kale.challenger_wins", str(wins).lower())
    client.update_model_version(name, version, description=text + "\n" + reason)
    log.info("%s v%s: %s", name, version, reason)
    return Review(version, bool(wins and auto_promote), reason, champion, comparison)


def load_champion(name: str, uri: str):
    """The champion's pyfunc model (raises RegistryUnavailable with the cause)."""
    import mlflow.pyfunc

    with mlflow_at(uri):
        try:
            return mlflow.pyfunc.load_model(f"models:/{name}@{CHAMPION}")
        except Exception as exc:  # noqa: BLE001
            raise RegistryUnavailable(f"cannot load {name}@{CHAMPION} from {uri}: {exc}") from exc
