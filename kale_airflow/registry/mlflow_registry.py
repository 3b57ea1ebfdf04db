"""Registry workflow shared by both models.

A new version gets the alias ``challenger``. It is compared with ``champion`` on the same
recent window; it becomes ``champion`` when auto-promotion is on and it wins (or there is
no champion yet). Otherwise it is tagged ``kale.review = pending`` with the comparison in
its description, and a reviewer promotes it in the MLflow UI by moving the ``champion``
alias. Decisions are tagged on the version so the UI shows why.

Two ways in:

* **Read path** (:func:`registry_client`, :func:`current_version`, :func:`load_champion`):
  used from threads of long-lived processes (the API server's Kale page, the triggerer's
  autoscaler). It uses one cached ``MlflowClient(uri, uri)`` per URI and touches no MLflow
  global and no environment variable.
* **Write path** (:func:`mlflow_at`): the retrain/refit task processes log runs with the
  fluent API, which needs MLflow's process-wide tracking URI, registry URI and experiment;
  it sets them for the duration of the block and restores every one afterwards.

Only MLflow's "not found" means absent; any other registry error (unreachable, 403, 5xx)
raises :class:`RegistryUnavailable` so no challenger is promoted on a failed lookup.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

from kale_airflow.core.errors import KaleError
from kale_airflow.store.database import masked

log = logging.getLogger(__name__)

FORECASTER_MODEL = "kale-traffic-forecaster"
THROUGHPUT_MODEL = "kale-throughput-model"
CHAMPION, CHALLENGER = "champion", "challenger"
EXPERIMENT = "kale"
PROBE_TIMEOUT_S = 5.0

NOTHING_CHANGED = "No model or alias was changed."


class RegistryUnavailable(KaleError, RuntimeError):
    """MLflow cannot be reached or refused the request; nothing was changed.

    The message is masked where it is made: it names the tracking URI, which may carry
    ``user:password@``, and it reaches logs, decision messages, ``kale status`` and the UI."""

    def __init__(self, message: str):
        super().__init__(masked(message))


def is_absent(exc: BaseException) -> bool:
    """Whether an MLflow error means "no such registered model / alias" (and nothing else).

    MLflow 3.17 (SQLite and REST stores alike) raises ``MlflowException`` (``RestException``
    over REST) with ``RESOURCE_DOES_NOT_EXIST`` for a missing registered model, and with
    ``INVALID_PARAMETER_VALUE`` "Registered model alias X not found." for a missing alias
    of an existing model. ``INVALID_PARAMETER_VALUE`` otherwise means a bad request, so it
    counts as absent only with that message.
    """
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
        return True
    text = str(exc).lower()
    return exc.error_code == "INVALID_PARAMETER_VALUE" and "alias" in text and "not found" in text


def _unavailable(uri: str, what: str, exc: BaseException) -> RegistryUnavailable:  # pragma: no mutate block
    code = getattr(exc, "error_code", None)
    cause = f"{type(exc).__name__}{f' {code}' if code else ''}: {str(exc)[:300]}"
    return RegistryUnavailable(f"MLflow at {uri} refused or failed {what} ({cause}); {NOTHING_CHANGED}")


def _uri_of(client) -> str:  # pragma: no mutate block
    return str(getattr(client, "_registry_uri", None) or getattr(client, "tracking_uri", None) or "?")


def check_reachable(uri: str) -> None:  # pragma: no mutate block
    """Fail fast, without MLflow's retries, when an HTTP tracking server does not answer.

    MLflow reads its retry and timeout settings only from the environment
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``/``_TIMEOUT``; no per-client setting in 3.17), and
    its default is minutes of retries. Setting them would change every thread of the API
    server or triggerer, so the read path probes the server itself with a short timeout
    instead; only the write path (its own task process) sets them.
    """
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as exc:
        raise RegistryUnavailable(
            f"MLflow at {uri} is unreachable ({type(exc).__name__}: {str(exc)[:200]}); "
            f"start the tracking server or fix KALE_MLFLOW_URI. {NOTHING_CHANGED}"
        ) from exc


def _resolve(uri: str) -> str:  # pragma: no mutate block
    """A ``kale_mlflow`` connection reference becomes its tracking URI (others pass through)."""
    from kale_airflow.registry.connection import CONN_PREFIX, resolve_uri

    if not uri.startswith(CONN_PREFIX):
        return uri
    try:
        return resolve_uri(uri)
    except Exception as exc:
        raise RegistryUnavailable(f"MLflow connection {uri[len(CONN_PREFIX):]!r} (KALE_MLFLOW_CONN_ID) cannot be "
                                  f"read: {type(exc).__name__}: {str(exc)[:200]}. {NOTHING_CHANGED}") from exc


@functools.lru_cache(maxsize=16)
def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def registry_client(uri: str):  # pragma: no mutate block
    """The cached ``MlflowClient`` for ``uri`` (tracking and registry), after a fast reachability
    check. Uses no MLflow global, so it is safe from any thread. ``uri`` may name a
    ``kale_mlflow`` Airflow connection (``KALE_MLFLOW_CONN_ID``; see :mod:`.connection`)."""
    uri = _resolve(uri)
    check_reachable(uri)
    try:
        return _client(uri)
    except Exception as exc:
        raise RegistryUnavailable(f"MLflow at {uri} is unreachable ({type(exc).__name__}: {str(exc)[:200]}); "
                                  f"fix KALE_MLFLOW_URI. {NOTHING_CHANGED}") from exc


_WRITE_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


@contextmanager
def mlflow_at(uri: str, artifact_root: str | None = None):
    """Write path for a pipeline task process: point MLflow's fluent API (runs, ``log_model``,
    ``register_model``) at ``uri`` and experiment ``kale``, with no retries, and restore the
    tracking URI, registry URI, active experiment and the environment afterwards.

    Not for threads of shared processes: use :func:`registry_client` there.
    """
    uri = _resolve(uri)
    import mlflow
    from mlflow.tracking import _model_registry, _tracking_service, fluent

    saved_env = {k: os.environ.get(k) for k in _WRITE_ENV}
    saved_tracking = _tracking_service.utils._tracking_uri
    saved_registry = _model_registry.utils._registry_uri
    saved_experiment = fluent._active_experiment_id
    # MLflow has no per-client retry setting; this process only writes, so no other thread
    # is affected, and the values are restored below.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        client = registry_client(uri)
        try:
            experiment = client.get_experiment_by_name(EXPERIMENT)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else client.create_experiment(EXPERIMENT, artifact_location=artifact_root))
        except Exception as exc:
            raise RegistryUnavailable(
                f"MLflow at {uri} is unreachable ({type(exc).__name__}: {str(exc)[:200]}); "
                f"start the tracking server or fix KALE_MLFLOW_URI. {NOTHING_CHANGED}"
            ) from exc
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        mlflow.set_experiment(experiment_id=experiment_id)
        yield client
    finally:
        mlflow.set_tracking_uri(saved_tracking)
        _model_registry.utils._registry_uri = saved_registry
        fluent._active_experiment_id = saved_experiment
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def alias_version(client, name: str, alias: str):
    """The ``ModelVersion`` behind an alias, None when the model or the alias does not exist;
    any other registry error raises :class:`RegistryUnavailable` with the cause."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except Exception as exc:
        if is_absent(exc):
            return None
        raise _unavailable(_uri_of(client), f"the lookup of {name}@{alias}", exc) from exc


def current_version(client, name: str, alias: str) -> str | None:
    """Version behind an alias, or None when the model or alias does not exist (other errors
    raise :class:`RegistryUnavailable`)."""
    mv = alias_version(client, name, alias)
    return None if mv is None else str(mv.version)


def register(client, name: str, run_id: str, artifact_path: str, description: str) -> str:
    """Register the run's model as a new version with alias ``challenger`` (inside :func:`mlflow_at`)."""
    import mlflow

    try:
        client.get_registered_model(name)
    except Exception as exc:
        if not is_absent(exc):
            raise _unavailable(_uri_of(client), f"the lookup of registered model {name}", exc) from exc
        client.create_registered_model(name, description=description)
    mv = mlflow.register_model(f"runs:/{run_id}/{artifact_path}", name)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return str(mv.version)


def review(client, name: str, version: str, challenger_score: float, champion_score: float | None,
           metric: str, auto_promote: bool, comparison: dict) -> Review:
    """Promote or hold the challenger (lower ``metric`` is better), tag and describe it.

    A registry error while looking up the champion raises :class:`RegistryUnavailable`
    before anything is changed: an unknown champion is never taken for a missing one."""
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
    log.info("%s v%s: %s", name, version, reason)  # pragma: no mutate
    return Review(version, bool(wins and auto_promote), reason, champion, comparison)


def load_version(name: str, version: str, uri: str):  # pragma: no mutate block
    """Version ``version`` of ``name`` as a pyfunc model, through the cached client's URIs only:
    its artifacts are downloaded to a temporary directory and loaded from there."""
    import mlflow.artifacts
    import mlflow.pyfunc

    uri = _resolve(uri)
    client = registry_client(uri)
    try:
        # Not ``models:/name/version``: MLflow resolves that through its global registry URI.
        location = client.get_model_version_download_uri(name, version)
        with tempfile.TemporaryDirectory(prefix="kale-model-") as tmp:
            local = mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=tmp, tracking_uri=uri)
            return mlflow.pyfunc.load_model(local)
    except Exception as exc:
        raise RegistryUnavailable(f"cannot load {name} v{version} from {uri}: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}") from exc


def load_champion(name: str, uri: str):  # pragma: no mutate block
    """The champion's pyfunc model. Raises :class:`LookupError` when there is no champion and
    :class:`RegistryUnavailable` with the cause when the registry fails."""
    version = current_version(registry_client(uri), name, CHAMPION)
    if version is None:
        raise LookupError(f"no {name}@{CHAMPION} in {masked(uri)}: run the retrain/refit DAG and promote one")
    return load_version(name, version, uri)
