"""The deployment's configuration, validated in one place.

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
    kale: {lookahead_s: 3600, forecast_quantile: 0.8}   # any KaleConfig field
    kubernetes: {image: ..., namespace: kale-training, gpus_per_worker: 1}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from kale_airflow.config import Settings


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field and what to do."""


@dataclass(frozen=True)
class Deployment:
    """Everything the autoscaler and the training DAG need to know."""

    stream_url: str
    group: str = "kale"
    worker_backend: str = "local"
    min_workers: int = 1
    max_workers: int = 8
    partitions: int | None = None
    slo_s: float = 300.0
    rescale_downtime_s: float = 90.0
    poll_interval_s: float = 15.0
    bin_s: float = 300.0
    training_dag_id: str = "kale_training"
    worker_batch_size: int = 512
    worker_step_time_s: float = 0.0
    kale: dict = field(default_factory=dict)
    kubernetes: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.worker_backend not in ("local", "kubernetes"):
            raise ConfigError(f"worker_backend must be 'local' or 'kubernetes', got {self.worker_backend!r}")
        if self.poll_interval_s <= 0 or self.bin_s <= 0:
            raise ConfigError("poll_interval_s and bin_s must be > 0")
        self.limits  # noqa: B018 - validates min/max/partitions with their own messages
        self.kale_config  # noqa: B018
        if self.worker_backend == "kubernetes":
            self.kubernetes_config  # noqa: B018

    @property
    def limits(self):
        """Worker bounds (validated)."""
        from kale_airflow.core.policies import Limits

        try:
            return Limits(self.min_workers, self.max_workers, self.partitions)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def kale_config(self):
        """The policy settings: SLO and downtime from here, the rest from ``kale:``."""
        from kale_airflow.core.policies import KaleConfig

        allowed = {f.name for f in fields(KaleConfig)} - {"slo_s", "rescale_downtime_s", "interval_s"}
        unknown = set(self.kale) - allowed
        if unknown:
            raise ConfigError(f"unknown kale setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        try:
            return KaleConfig(**self.kale, slo_s=self.slo_s, rescale_downtime_s=self.rescale_downtime_s,
                              interval_s=self.poll_interval_s)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"kale: {exc}") from None

    @property
    def kubernetes_config(self):
        """GPU worker pod settings."""
        from kale_airflow.runtime.kubernetes import KubernetesWorkerConfig

        allowed = {f.name for f in fields(KubernetesWorkerConfig)}
        unknown = set(self.kubernetes) - allowed
        if unknown:
            raise ConfigError(f"unknown kubernetes setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        try:
            return KubernetesWorkerConfig(**self.kubernetes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"kubernetes: {exc}") from None


def load_deployment(settings: Settings) -> Deployment:
    """Read and validate the configuration file (or use the embedded defaults)."""
    path = Path(os.environ["KALE_CONFIG"]) if os.environ.get("KALE_CONFIG") else settings.home / "kale.yaml"
    data: dict = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must be a mapping of settings")
    elif os.environ.get("KALE_CONFIG"):
        raise ConfigError(f"KALE_CONFIG points to {path}, which does not exist")
    allowed = {f.name for f in fields(Deployment)}
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    data.setdefault("stream_url", f"sqlite:///{settings.home / 'stream.db'}")
    try:
        return Deployment(**data)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
