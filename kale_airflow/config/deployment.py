"""The deployment's configuration, validated once into typed, frozen objects.

Read from the YAML file ``$KALE_CONFIG`` (or ``$KALE_HOME/kale.yaml`` when present), else
defaults for the embedded default. The Helm chart renders the same file into a ConfigMap.

.. code-block:: yaml

    stream_url: kafka://kafka.kale:9092/samples   # default sqlite:///$KALE_HOME/stream.db
    worker_backend: kubernetes                    # or local
    min_workers: 1
    max_workers: 64
    partitions: 64
    slo_s: 300
    rescale_downtime_s: 90
    poll_interval_s: 15
    kale: {lookahead_s: 3600, forecast_quantile: 0.8}   # any KaleConfig field (defaults: 900, 0.5)
    kubernetes: {image: ..., namespace: kale-training, gpus_per_worker: 1}
    worker_device: auto                           # or cpu, cuda; worker_amp: true for bf16 on CUDA

Types are strict (``"15"`` is not a number; an integer is a valid float); every error
names the file, the field, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cached_property
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from kale_airflow.config.environment import Settings
from kale_airflow.core.errors import KaleError
from kale_airflow.core.policies import KaleConfig, Limits

STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class ConfigError(KaleError, ValueError):
    """The configuration is invalid; the message names the file, the field and what to do."""


class KubernetesWorkerConfig(BaseModel):
    """Where and how GPU worker pods run (Helm values feed these)."""

    model_config = STRICT

    image: str = "ghcr.io/kale-airflow/worker:0.1.0"
    namespace: str = "kale-training"
    gpus_per_worker: int = Field(1, ge=0)
    cpu_request: str = "4"
    memory_request: str = "16Gi"
    memory_limit: str = "16Gi"
    node_selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    checkpoint_claim: str = "kale-checkpoints"
    service_account: str = "kale-worker"
    run_as_user: int = 1000
    grace_period_s: int = Field(120, ge=0)
    kubernetes_conn_id: str = "kubernetes_default"
    # The control-plane database URL (KALE_DATABASE_URL) reaches the pods only from this
    # Secret (a secretKeyRef, never a plain value in the pod spec); the chart creates it or
    # names an existing one.
    database_secret: str = Field("kale-database", pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    database_secret_key: str = Field("url", pattern=r"^[-._a-zA-Z0-9]{1,253}$")
    # Airflow pool of the mapped worker-pod tasks (create it with as many slots as GPU workers).
    pool: str = Field("kale_gpu", min_length=1, max_length=256)
    # Seconds a Pending pod may wait to be scheduled (a node autoscaler adding a GPU node takes
    # minutes), then seconds from scheduled to running (pulling a large GPU image).
    schedule_timeout_s: int = Field(1800, gt=0)
    startup_timeout_s: int = Field(600, gt=0)
    # Deferrable pods free the Airflow worker slot: the triggerer watches the pod.
    deferrable: bool = True
    # Triggerer: seconds between pod status reads, and between log fetches (None: logs at the end only).
    poll_interval_s: float = Field(10.0, gt=0)
    logging_interval_s: int | None = Field(300, gt=0)

    @field_validator("run_as_user")
    @classmethod
    def _not_root(cls, uid: int) -> int:
        if uid <= 0:
            raise ValueError(f"run_as_user {uid} is root or invalid; workers run as a non-root user (e.g. 1000)")
        return uid


class AlertsConfig(BaseModel):
    """Where alerts go: an Airflow notifier class (e.g.
    ``airflow.providers.smtp.notifications.smtp.SmtpNotifier`` or the Slack provider's
    ``SlackNotifier``) built with ``notifier_kwargs``; without one, alerts are only logged.
    Templated notifier fields see ``{{ kale_alert.title }}``, ``{{ kale_alert.message }}``
    and ``{{ kale_alert.kind }}``."""

    model_config = STRICT

    notifier: str | None = Field(None, pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")
    notifier_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The freshness lag counts as "SLO at risk" from this fraction of slo_s; alert after this long at risk.
    slo_risk_fraction: float = Field(0.8, gt=0)
    slo_risk_minutes: float = Field(10.0, gt=0)
    task_failures: bool = True      # a failed retrain/refit/training/autoscaler task (on_failure_callback)
    review_pending: bool = True     # a challenger held for review in MLflow


# The policy's own fields (core.policies.KaleConfig) as a strict model, so ``kale:`` is
# validated field by field; SLO, downtime and interval come from the top level.
_FROM_TOP_LEVEL = {"slo_s", "rescale_downtime_s", "interval_s"}
_KALE_TYPES = typing.get_type_hints(KaleConfig)
KalePolicySettings = create_model(
    "KalePolicySettings", __config__=STRICT,
    **{f.name: (_KALE_TYPES[f.name], f.default) for f in dataclasses.fields(KaleConfig) if f.name not in _FROM_TOP_LEVEL},
)


class Deployment(BaseModel):
    """Everything the autoscaler and the training DAG need to know."""

    model_config = STRICT

    stream_url: str
    group: str = "kale"
    worker_backend: Literal["local", "kubernetes"] = "local"
    min_workers: int = 1
    max_workers: int = 8
    partitions: int | None = None
    slo_s: float = Field(300.0, gt=0)
    rescale_downtime_s: float = Field(90.0, ge=0)
    poll_interval_s: float = Field(15.0, gt=0)
    bin_s: float = Field(300.0, gt=0)
    training_dag_id: str = "kale_training"
    worker_batch_size: int = Field(512, ge=1)
    worker_step_time_s: float = Field(0.0, ge=0)
    # The workers' torch device: auto (CUDA when the worker sees a GPU, else CPU), cpu, or cuda
    # (a worker without a GPU fails, naming this setting); bf16 mixed precision on CUDA.
    worker_device: Literal["auto", "cpu", "cuda"] = "auto"
    worker_amp: bool = False
    # How long a new generation waits for the workers it supersedes to checkpoint and stop
    # (they notice within a report interval; pods get their grace period) before it fails.
    handover_timeout_s: float = Field(180.0, gt=0)
    kale: KalePolicySettings = Field(default_factory=KalePolicySettings)  # type: ignore[valid-type]
    kubernetes: KubernetesWorkerConfig = Field(default_factory=KubernetesWorkerConfig)
    # Shadow mode: observe, decide and record every decision (``applied: false``) beside the
    # autoscaler already in charge (HPA, KEDA, a person); never start or stop a worker.
    shadow: bool = False
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "Deployment":
        self.limits  # noqa: B018 - min/max/partitions, with the policy's own messages
        self.kale_config  # noqa: B018 - e.g. lookahead_s must cover rescale_downtime_s
        return self

    @cached_property
    def limits(self) -> Limits:
        """Worker bounds."""
        return Limits(self.min_workers, self.max_workers, self.partitions)

    @cached_property
    def kale_config(self) -> KaleConfig:
        """The policy settings: SLO, downtime and poll interval from the top level, the rest from ``kale:``."""
        return KaleConfig(**self.kale.model_dump(), slo_s=self.slo_s, rescale_downtime_s=self.rescale_downtime_s,
                          interval_s=self.poll_interval_s)


_SECTIONS = {(): Deployment, ("kale",): KalePolicySettings, ("kubernetes",): KubernetesWorkerConfig,
             ("alerts",): AlertsConfig}


def explain(exc: ValidationError, source: str) -> ConfigError:
    """One line per problem: the field, what was expected, what was found (unknown keys list the allowed ones)."""
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        field = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = sorted(_SECTIONS.get(loc[:-1], Deployment).model_fields)
            lines.append(f"{field}: unknown setting; allowed here: {', '.join(allowed)}")
        elif err["type"] == "value_error":
            lines.append(f"{field}: {str(err.get('ctx', {}).get('error', err['msg']))}")
        else:
            got = err.get("input")
            lines.append(f"{field}: {err['msg'].lower()}, got {got!r} ({type(got).__name__})")
    return ConfigError(f"{source}: invalid configuration:\n  " + "\n  ".join(lines))


def parse_deployment(data: dict, source: str = "configuration") -> Deployment:
    """Validate a mapping of settings (e.g. parsed YAML) into a :class:`Deployment`."""
    try:
        return Deployment.model_validate(data)
    except ValidationError as exc:
        raise explain(exc, source) from None


def load_deployment(settings: Settings) -> Deployment:
    """Read and validate the configuration file (or use the embedded defaults)."""
    path = settings.config_file or settings.home / "kale.yaml"
    data: Any = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a mapping of settings, got a {type(data).__name__}")
    elif settings.config_file is not None:
        raise ConfigError(f"KALE_CONFIG points to {path}, which does not exist; create it or unset KALE_CONFIG")
    data.setdefault("stream_url", f"sqlite:///{settings.stream_db}")
    return parse_deployment(data, str(path))
