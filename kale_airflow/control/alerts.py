"""Alerts through Airflow's notifiers (the SMTP or Slack notifier a user already configured).

The deployment file names the notifier class and its arguments::

    alerts:
      notifier: airflow.providers.smtp.notifications.smtp.SmtpNotifier
      notifier_kwargs: {to: oncall@example.com, subject: "{{ kale_alert.title }}",
                        html_content: "{{ kale_alert.message }}"}
      slo_risk_minutes: 10

Without a notifier, alerts are logged (warning) only. Alerts sent:

- ``slo_risk``: the freshness lag stayed at or above ``slo_risk_fraction`` x ``slo_s`` for
  ``slo_risk_minutes`` (once per episode; the autoscaler tracks it between pokes);
- ``task_failed``: a Kale task failed for good (the DAGs' ``on_failure_callback``: retrain,
  refit, a generation whose worker pods exhausted their retries, the autoscaler);
- ``review_pending``: a challenger model was held for review in MLflow.

A notifier that fails is logged and never breaks the task or the autoscaler.
"""

from __future__ import annotations

import importlib
import logging

from kale_airflow.config import AlertsConfig

log = logging.getLogger(__name__)
SLO_STATE_KEY = "alerts/slo_risk"


class Alerter:
    """Send one alert through the configured notifier (a fresh instance per alert, since
    Airflow notifiers render their templated fields in place)."""

    def __init__(self, config: AlertsConfig | None = None, logger: logging.Logger | None = None):
        self.config = config or AlertsConfig()
        self.log = logger or log

    def notifier(self):
        """A new notifier instance, or None (log only)."""
        path = self.config.notifier
        if not path:
            return None
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ImportError(f"alerts.notifier {path!r} cannot be imported ({exc}); install its provider "
                              "(e.g. pip install apache-airflow-providers-smtp) or fix the class path") from None
        return cls(**self.config.notifier_kwargs)

    def send(self, kind: str, title: str, message: str, context: dict | None = None) -> bool:
        """Log the alert and hand it to the notifier; True when a notifier accepted it."""
        self.log.warning("kale alert [%s] %s: %s", kind, title, message)
        try:
            notifier = self.notifier()
            if notifier is None:
                return False
            ctx = dict(context or {})
            ctx["kale_alert"] = {"kind": kind, "title": title, "message": message}
            notifier(ctx)
            return True
        except Exception as exc:  # noqa: BLE001 - an alert channel outage must not fail the work it reports on
            self.log.error("kale alert [%s] could not be delivered through %s: %s", kind, self.config.notifier, exc)
            return False


def alerter(logger: logging.Logger | None = None, job: str | None = None) -> Alerter:
    """Job ``job``'s alerter (None: the deployment's only job); the log-only default when the
    configuration cannot be read."""
    from kale_airflow.config import ConfigError, load_config

    try:
        return Alerter(load_config(job).deployment.alerts, logger)
    except ConfigError as exc:
        (logger or log).error("alerts use the log-only default: %s", exc)
        return Alerter(None, logger)


def task_failure_callback(context: dict) -> None:
    """``on_failure_callback`` of the Kale DAGs: a task failed after its retries (or for good)."""
    from kale_airflow.config import job_of_dag

    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    a = alerter(job=job_of_dag(dag_id))
    if not a.config.task_failures:
        return
    task_id = getattr(ti, "task_id", "?")
    map_index = getattr(ti, "map_index", -1)
    if isinstance(map_index, int) and map_index >= 0:  # one of a generation's mapped worker pods
        task_id = f"{task_id}[{map_index}]"
    run_id = context.get("run_id") or getattr(ti, "run_id", "?")
    try_number = getattr(ti, "try_number", None)
    generation = (context.get("params") or {}).get("generation")  # kale_training: the generation that failed
    of_generation = f" of generation {generation}" if generation else ""
    exc = context.get("exception")
    a.send("task_failed", f"{dag_id}.{task_id}{of_generation} failed",
           f"{dag_id}.{task_id}{of_generation} (run {run_id}, try {try_number}) failed for good: {exc}",
           context)


def review_pending(result: dict, model: str, logger: logging.Logger | None = None, job: str | None = None) -> bool:
    """Alert when a promote-or-hold result held the challenger for review; True if one was sent."""
    if result.get("promoted"):
        return False
    a = alerter(logger, job)
    if not a.config.review_pending:
        return False
    a.send("review_pending", f"{model} v{result.get('version')} waits for review",
           f"challenger {model} v{result.get('version')} was held: {result.get('reason')}. Review it in the "
           "MLflow UI (its description holds the comparison).")
    return True


class SloRiskWatch:
    """Tracks how long the freshness lag has been at risk; says when to alert (once per episode).

    ``state`` is a JSON-able dict the autoscaler persists between pokes and runs."""

    def __init__(self, config: AlertsConfig, slo_s: float, state: dict | None = None):
        self.config, self.slo_s = config, slo_s
        self.state = dict(state or {"since": None, "alerted": False})

    def update(self, now: float, freshness_lag_s: float | None) -> str | None:
        """The alert message when one is due now, else None. An unknown lag changes nothing."""
        if freshness_lag_s is None:
            return None
        threshold = self.config.slo_risk_fraction * self.slo_s
        if freshness_lag_s < threshold:
            self.state = {"since": None, "alerted": False}
            return None
        if self.state.get("since") is None:
            self.state = {"since": now, "alerted": False}
        at_risk_s = now - self.state["since"]
        if at_risk_s >= 60 * self.config.slo_risk_minutes and not self.state.get("alerted"):
            self.state["alerted"] = True
            return (f"freshness lag {freshness_lag_s:.0f} s has been at or above {threshold:.0f} s "
                    f"({self.config.slo_risk_fraction:.0%} of the {self.slo_s:g} s SLO) for {at_risk_s / 60:.1f} min")
        return None
