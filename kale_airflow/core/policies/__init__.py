"""Scaling policies: Kale (the planner, and the rules it replaced), HPA, KEDA, Autopilot-style, static (and the oracle = Kale on the truth)."""

from kale_airflow.core.policies.base import Decision, Limits, Observation, Policy, Reason
from kale_airflow.core.policies.hpa import HPAConfig, HPAPolicy
from kale_airflow.core.policies.kale import KaleConfig, KalePolicy, build_kale
from kale_airflow.core.policies.kale_rules import RulesConfig, RulesPolicy, make_online_rules
from kale_airflow.core.policies.keda import KEDAConfig, KEDAPolicy
from kale_airflow.core.policies.simple import AutopilotConfig, AutopilotPolicy, StaticPolicy

__all__ = [
    "AutopilotConfig", "AutopilotPolicy", "Decision", "HPAConfig", "HPAPolicy", "KEDAConfig", "KEDAPolicy",
    "KaleConfig", "KalePolicy", "Limits", "Observation", "Policy", "Reason", "RulesConfig", "RulesPolicy", "StaticPolicy",
    "build_kale", "make_online_rules",
]
