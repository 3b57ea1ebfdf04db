"""One typed configuration: the environment (:class:`Settings`, every path derived there)
and one job's settings from the deployment file (:class:`Deployment`), parsed once by
:func:`load_config`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kale_airflow.config.deployment import (
    AlertsConfig,
    ConfigError,
    Deployment,
    KubernetesWorkerConfig,
    dag_id,
    job_of_dag,
    load_deployment,
    parse_deployment,
)
from kale_airflow.config.environment import Settings, settings


@dataclass(frozen=True)
class Config:
    """The environment and one job's validated settings, together."""

    settings: Settings
    deployment: Deployment

    @property
    def job(self) -> str:
        """The job these settings are of (``default`` for a single-job deployment)."""
        return self.deployment.job


def load_config(job: str | None = None) -> Config:
    """Read the environment and the deployment file once and take job ``job``'s settings
    (None: the deployment's only job); raises :class:`ConfigError`."""
    env = settings()
    dep = load_deployment(env).for_job(job)
    return Config(dataclasses.replace(env, job=dep.job), dep)


__all__ = ["AlertsConfig", "Config", "ConfigError", "Deployment", "KubernetesWorkerConfig", "Settings", "dag_id",
           "job_of_dag", "load_config", "load_deployment", "parse_deployment", "settings"]
