"""Scaling policies: Kale, HPA, KEDA, Autopilot-style, static (and the oracle = Kale on the truth)."""

from kale_airflow.core.policies.base import Decision, Limits, Observation, Policy, Reason
from kale_airflow.core.policies.hpa import HPAConfig, HPAPolicy
from kale_airflow.core.policies.kale import KaleConfig, KalePolicy, make_online_kale
from kale_airflow.core.policies.keda import KEDAConfig, KEDAPolicy
from kale_airflow.core.policies.simple import AutopilotConfig, AutopilotPolicy, StaticPolicy

__all__ = [
    "AutopilotConfig", "AutopilotPolicy", "Decision", "HPAConfig", "HPAPolicy", "KEDAConfig", "KEDAPolicy",
    "KaleConfig", "KalePolicy", "Limits", "Observation", "Policy", "Reason", "StaticPolicy", "make_online_kale",
]
