"""Registry workflow shared by both models.

A new version gets the alias ``challenger``. It is compared with ``champion`` on the same
recent window; it becomes ``champion`` when auto-promotion is on and it wins (or there is
no champion yet). Otherwise it is tagged ``kale.review = pending`` with the comparison in
its description, and a reviewer promotes it with ``kale promote`` (:func:`promote`, which
records who and when) or by moving the ``champion`` alias in the MLflow UI (recorded as
``approved-manually`` when the autoscaler notices: :func:`record_manual_approval`).
Decisions are tagged on the version so the UI shows why (:mod:`.approvals`).

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
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.core.errors import KaleError
from kale_airflow.registry.approvals import (
    APPROVED,
    APPROVED_MANUALLY,
    AUTO_APPROVER,
    MANUAL_APPROVER,
    PENDING,
    PROMOTED,
    REVIEW_TAG,
    SUPERSEDED_AT,
    SUPERSEDED_BY,
    Promotion,
    approval_tags,
    format_metric,
    iso,
    moved_by_hand,
    superseded_tags,
)
from kale_airflow.store.database import masked

log = logging.getLogger(__name__)

FORECASTER_MODEL = "kale-traffic-forecaster"
THROUGHPUT_MODEL = "kale-throughput-model"


def job_models(job: str = DEFAULT_JOB) -> tuple[str, str]:
    """A job's registered models, (forecaster, throughput model): the plain names for the
    ``default`` job, ``<name>-<job>`` for the others (each job forecasts its own traffic)."""
    if job == DEFAULT_JOB:
        return FORECASTER_MODEL, THROUGHPUT_MODEL
    return f"{FORECASTER_MODEL}-{job}", f"{THROUGHPUT_MODEL}-{job}"


def job_of_model(name: str) -> str | None:
    """The job a registered model name is of (the inverse of :func:`job_models`); None: not a kale model."""
    for base in (FORECASTER_MODEL, THROUGHPUT_MODEL):
        if name == base:
            return "default"
        if name.startswith(base + "-"):
            return name[len(base) + 1:]
    return None

CHAMPION, CHALLENGER = "champion", "challenger"
EXPERIMENT = "kale"
PROBE_TIMEOUT_S = 5.0

NOTHING_CHANGED = "No model or alias was changed."
# A model logged from code is built by running its file, which hands the model over through one
# module-level variable of MLflow's (set_model): two threads loading at once could swap models.
_LOAD_LOCK = threading.Lock()


class RegistryUnavailable(KaleError, RuntimeError):
    """MLflow cannot be reached or refused the request; nothing was changed.

    The message is masked where it is made: it names the tracking URI, which may carry
    ``user:password@``, and it reaches logs, decision messages, ``kale status`` and the UI."""

    def __init__(self, message: str):
        super().__init__(masked(message))


class TrackingUriError(RegistryUnavailable):
    """The tracking URI is one the registry cannot open (a scheme MLflow has no store for, or
    its deprecated file store); nothing was asked or created."""


class UnknownModelVersion(KaleError, LookupError):
    """The registered model or the version named does not exist; the message lists what does."""


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


def check_tracking_uri(uri: str) -> None:
    """Refuse a tracking URI that opening the registry would refuse, without connecting or
    creating anything (``kale config validate`` runs this too, so both say the same).

    MLflow's own store lookup decides which schemes work (``http(s)``, ``sqlite`` and the other
    databases, ``databricks``...); a plain path or ``file:`` URI is MLflow 3's file store,
    which it refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``. An ``airflow-connection:``
    reference passes: the URI it stands for is checked when the connection is read."""
    from kale_airflow.registry.connection import CONN_PREFIX

    if uri.startswith(CONN_PREFIX):
        return
    if not uri.strip():
        raise TrackingUriError("the MLflow tracking URI is empty: set KALE_MLFLOW_URI (http(s)://HOST:PORT or "
                               f"sqlite:///PATH) or KALE_MLFLOW_CONN_ID. {NOTHING_CHANGED}")
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    from mlflow.exceptions import MlflowException
    from mlflow.tracking._model_registry.utils import _get_store_registry
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    from mlflow.utils.uri import get_uri_scheme

    try:
        for stores in (_tracking_store_registry, _get_store_registry()):
            stores.get_store_builder(uri)
    except MlflowException as exc:
        raise TrackingUriError(f"MLflow cannot open the tracking URI {uri} ({exc.message.strip()}); fix "
                               f"KALE_MLFLOW_URI. {NOTHING_CHANGED}") from None
    named = uri in ("databricks", "databricks-uc", "uc")  # names, not paths, to MLflow
    if not named and get_uri_scheme(uri) in ("", "file") and not MLFLOW_ALLOW_FILE_STORE.get():
        raise TrackingUriError(f"the tracking URI {uri} is a folder, MLflow's file store, which MLflow 3 refuses "
                               "(unless MLFLOW_ALLOW_FILE_STORE=true): use sqlite:///PATH or an MLflow server's "
                               f"http(s):// URL in KALE_MLFLOW_URI. {NOTHING_CHANGED}")


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
    check_tracking_uri(uri)
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


def register(client, name: str, model_uri: str, description: str) -> str:
    """Register a logged model (``model_uri``: the ``models:/m-...`` URI that ``log_model``
    returns, which MLflow 3 registers without a warning, unlike ``runs:/RUN/PATH``) as a new
    version of ``name`` with alias ``challenger`` (inside :func:`mlflow_at`)."""
    import mlflow

    try:
        client.get_registered_model(name)
    except Exception as exc:
        if not is_absent(exc):
            raise _unavailable(_uri_of(client), f"the lookup of registered model {name}", exc) from exc
        client.create_registered_model(name, description=description)
    mv = mlflow.register_model(model_uri, name)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return str(mv.version)


def review(client, name: str, version: str, challenger_score: float, champion_score: float | None,
           metric: str, auto_promote: bool, comparison: dict, now: float | None = None) -> Review:
    """Promote or hold the challenger (lower ``metric`` is better), tag and describe it (metrics
    to 4 significant digits: :func:`~.approvals.format_metric`).

    A registry error while looking up the champion raises :class:`RegistryUnavailable`
    before anything is changed: an unknown champion is never taken for a missing one."""
    champion = current_version(client, name, CHAMPION)
    if champion_score is None or champion is None:
        wins, why = True, "no champion yet"
    else:
        wins = challenger_score < champion_score
        why = f"{metric} {challenger_score:.4g} vs champion v{champion} {champion_score:.4g}"
    table = "\n".join(f"| {k} | {format_metric(v)} |" for k, v in comparison.items())
    text = f"Challenger v{version}: {why}.\n\n| metric | value |\n| --- | --- |\n{table}\n"
    at = iso(time.time() if now is None else now)
    if wins and auto_promote:
        before = dict(model_version(client, name, version).tags or {})  # a retried task's tags, if any
        _make_champion(client, name, version, approval_tags(PROMOTED, AUTO_APPROVER, at), before, champion, at)
        reason = f"promoted automatically: {why}"
    else:
        client.set_model_version_tag(name, version, REVIEW_TAG, PENDING)
        reason = (f"held for review: {why}" + ("" if wins else " (the challenger does not win)")
                  + f"; promote it with `kale promote {name} {version}` (or move the 'champion' alias in the "
                  "MLflow UI)")
    client.set_model_version_tag(name, version, "kale.challenger_wins", str(wins).lower())
    client.update_model_version(name, version, description=text + "\n" + reason)
    log.info("%s v%s: %s", name, version, reason)  # pragma: no mutate
    return Review(version, bool(wins and auto_promote), reason, champion, comparison)


def _make_champion(client, name: str, version: str, tags: dict[str, str], before: dict[str, str],
                   previous: str | None, at: str) -> None:
    """Tag ``version`` approved, move ``champion`` to it, then mark ``previous`` superseded.

    The approval is tagged before the alias moves, so that the autoscaler, looking between the
    two calls, never takes the new champion for one moved by hand; a failed move puts the
    version's tags back as they were (``before``)."""
    try:
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, value)
        client.set_registered_model_alias(name, CHAMPION, version)
    except Exception as exc:
        _restore_tags(client, name, version, before, tags)
        raise _unavailable(_uri_of(client), f"the promotion of {name} v{version}", exc) from exc
    try:
        for key in (SUPERSEDED_BY, SUPERSEDED_AT):
            if key in before:  # champion again: no longer superseded
                client.delete_model_version_tag(name, version, key)
        if previous and previous != version:
            for key, value in superseded_tags(version, at).items():
                client.set_model_version_tag(name, previous, key, value)
    except Exception as exc:  # noqa: BLE001 - the promotion itself is done; only the superseded notes are off
        log.warning("%s v%s is champion, but the superseded tags (of v%s and v%s) could not be updated: %s", name,
                    version, version, previous, masked(exc))


def _restore_tags(client, name: str, version: str, before: dict[str, str], written: dict[str, str]) -> None:
    for key in written:
        try:
            if key in before:
                client.set_model_version_tag(name, version, key, before[key])
            else:
                client.delete_model_version_tag(name, version, key)
        except Exception as exc:  # noqa: BLE001 - best effort: the error that stopped the promotion is raised
            log.warning("could not restore tag %s of %s v%s: %s", key, name, version, masked(exc))  # pragma: no mutate


def model_version(client, name: str, version: str):
    """The ``ModelVersion``; :class:`UnknownModelVersion` naming the versions that exist when the
    model or the version does not, :class:`RegistryUnavailable` for any other registry error."""
    uri = masked(_uri_of(client))
    try:
        return client.get_model_version(name, version)
    except Exception as exc:
        if not is_absent(exc) and getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
            raise _unavailable(_uri_of(client), f"the lookup of {name} v{version}", exc) from exc
    try:
        found = sorted((int(mv.version) for mv in client.search_model_versions(f"name = '{name}'")), reverse=True)
    except Exception as exc:
        raise _unavailable(_uri_of(client), f"the search for versions of {name}", exc) from exc
    if not found:
        raise UnknownModelVersion(f"MLflow at {uri} has no registered model {name}: its first version comes from the "
                                  "retrain/refit DAG. Nothing was changed.")
    raise UnknownModelVersion(f"{name} has no version {version!r} in MLflow at {uri}; its versions are "
                              f"{', '.join(map(str, found[:20]))}{' ...' if len(found) > 20 else ''}. "
                              "Nothing was changed.")


def promote(client, name: str, version: str, by: str, now: float | None = None) -> Promotion:
    """A reviewer's promotion: ``version`` becomes ``champion``, tagged ``kale.review=approved``
    with ``kale.approved_by`` = ``by`` and ``kale.approved_at`` (ISO time); the champion it
    replaces is tagged superseded. Promoting the champion again records the approval only.

    Raises :class:`UnknownModelVersion` (nothing changed) or :class:`RegistryUnavailable`."""
    mv = model_version(client, name, version)
    version = str(mv.version)
    previous = current_version(client, name, CHAMPION)
    at = iso(time.time() if now is None else now)
    _make_champion(client, name, version, approval_tags(APPROVED, by, at), dict(mv.tags or {}), previous, at)
    log.info("%s v%s promoted by %s (champion before: %s)", name, version, by, previous)  # pragma: no mutate
    return Promotion(name, version, previous, by, at)


def record_manual_approval(client, name: str, version: str, previous: str | None, now: float) -> bool:
    """Tag the champion ``version`` ``approved-manually`` when its tags show Kale did not approve
    it (:func:`~.approvals.moved_by_hand`: someone moved the alias in the MLflow UI), and
    ``previous`` (the champion seen before it, if known) superseded. Returns whether it tagged.

    Nothing is tagged when ``version`` is no longer the champion: the next check sees the new one."""
    mv = alias_version(client, name, CHAMPION)
    if mv is None or str(mv.version) != str(version) or not moved_by_hand(mv.tags or {}):
        return False
    at = iso(now)
    tags = dict(mv.tags or {})
    for key, value in approval_tags(APPROVED_MANUALLY, MANUAL_APPROVER, at).items():
        client.set_model_version_tag(name, version, key, value)
    for key in (SUPERSEDED_BY, SUPERSEDED_AT):
        if key in tags:
            client.delete_model_version_tag(name, version, key)
    if previous and previous != str(version):
        for key, value in superseded_tags(version, at).items():
            client.set_model_version_tag(name, previous, key, value)
    return True


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
            with _LOAD_LOCK:
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
