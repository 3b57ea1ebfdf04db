"""One typed configuration: the environment (:class:`Settings`, every path derived there)
and the deployment file (:class:`Deployment`), parsed once by :func:`load_config`."""

from __future__ import annotations

from dataclasses import dataclass

from kale_airflow.config.deployment import (
    AlertsConfig,
    ConfigError,
    Deployment,
    KubernetesWorkerConfig,
    load_deployment,
    parse_deployment,
)
from kale_airflow.config.environment import Settings, settings


@dataclass(frozen=True)
class Config:
    """The environment and the validated deployment, together."""

    settings: Settings
    deployment: Deployment


def load_config() -> Config:
    """Read the environment and the deployment file once; raises :class:`ConfigError`."""
    env = settings()
    return Config(env, load_deployment(env))


__all__ = ["AlertsConfig", "Config", "ConfigError", "Deployment", "KubernetesWorkerConfig", "Settings", "load_config",
           "load_deployment", "parse_deployment", "settings"]
