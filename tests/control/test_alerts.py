"""Alerts through an Airflow notifier named in the deployment file (a recording notifier
defined here): SLO at risk for too long (once per episode), a task that failed for good,
a challenger held for review; the log-only default; a broken channel never raises."""

import logging
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk import BaseNotifier

from kale_airflow.config import AlertsConfig, Config, Deployment, Settings
from kale_airflow.control.alerts import Alerter, SloRiskWatch, review_pending, task_failure_callback
from kale_airflow.control.autoscaler import Autoscaler
from kale_airflow.core.policies import Observation

SENT: list[dict] = []
NOTIFIER = "tests.control.test_alerts.RecordingNotifier"


class RecordingNotifier(BaseNotifier):
    """Records what it was asked to send, with its templated subject rendered like Airflow's own."""

    template_fields = ("subject",)

    def __init__(self, subject: str = "{{ kale_alert.title }}", channel: str = "#oncall"):
        super().__init__()
        self.subject, self.channel = subject, channel

    def notify(self, context):
        SENT.append({"subject": self.subject, "channel": self.channel, **context["kale_alert"]})


class BrokenNotifier(BaseNotifier):
    def notify(self, context):
        raise ConnectionError("SMTP server down")


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    SENT.clear()
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    yield
    from kale_airflow.store.database import forget_databases

    forget_databases()


def configure(tmp_path, **alerts):
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump({"alerts": {"notifier": NOTIFIER,
                                                                   "notifier_kwargs": {"channel": "#kale"}} | alerts}))


def test_slo_risk_alerts_once_per_episode_after_the_configured_time():
    watch = SloRiskWatch(AlertsConfig(slo_risk_minutes=5, slo_risk_fraction=0.8), slo_s=300)
    assert watch.update(0, 250) is None  # at risk from 240 s of lag: the episode starts
    assert watch.update(240, 260) is None and watch.update(290, None) is None  # unknown lag changes nothing
    msg = watch.update(300, 270)
    assert msg and "5.0 min" in msg and "80% of the 300 s SLO" in msg
    assert watch.update(400, 280) is None  # once per episode
    assert watch.update(500, 10) is None  # recovered
    assert watch.update(600, 250) is None and watch.update(900, 250)  # a new episode alerts again


def test_the_autoscaler_sends_slo_risk_through_the_notifier(tmp_path):
    dep = Deployment(stream_url=f"sqlite:///{tmp_path / 's.db'}", slo_s=60,
                     alerts={"notifier": NOTIFIER, "notifier_kwargs": {"channel": "#kale"}, "slo_risk_minutes": 1})
    auto = Autoscaler(Config(Settings(tmp_path, "sqlite:///x"), dep), stream=object(), metrics=object(),
                      registry=object())
    for t in range(0, 181, 15):
        auto._watch_slo(1000.0 + t, Observation(1000.0 + t, 2, 10.0, 5000.0, freshness_lag_s=55.0))
    assert len(SENT) == 1
    assert SENT[0]["kind"] == "slo_risk" and SENT[0]["channel"] == "#kale"
    assert SENT[0]["subject"] == "Kale: freshness SLO at risk"  # the template was rendered
    # the episode lives in the control plane: a restarted autoscaler does not alert again
    again = Autoscaler(Config(Settings(tmp_path, "sqlite:///x"), dep), stream=object(), metrics=object(),
                       registry=object())
    again._watch_slo(1200.0, Observation(1200.0, 2, 10.0, 5000.0, freshness_lag_s=55.0))
    assert len(SENT) == 1


def test_a_failed_task_alerts_through_the_on_failure_callback(tmp_path):
    configure(tmp_path)
    ti = SimpleNamespace(dag_id="kale_throughput_refit", task_id="fit", run_id="manual__1", try_number=3)
    task_failure_callback({"ti": ti, "exception": ValueError("no observations")})
    assert len(SENT) == 1
    assert SENT[0]["kind"] == "task_failed" and SENT[0]["subject"] == "kale_throughput_refit.fit failed"
    assert "try 3" in SENT[0]["message"] and "no observations" in SENT[0]["message"]
    configure(tmp_path, task_failures=False)
    task_failure_callback({"ti": ti, "exception": ValueError("again")})
    assert len(SENT) == 1


def test_a_worker_pod_out_of_retries_names_its_generation_and_worker(tmp_path):
    """The mapped pod task of kale_training: which generation and which worker (the slow
    tests/dags/test_training_alerts.py runs the DAG through the pods' retries for real)."""
    configure(tmp_path)
    ti = SimpleNamespace(dag_id="kale_training", task_id="worker_pods", map_index=2, run_id="manual__2", try_number=4)
    task_failure_callback({"ti": ti, "params": {"workers": 4, "generation": "g7"}, "exception": RuntimeError("boom")})
    assert SENT[0]["subject"] == "kale_training.worker_pods[2] of generation g7 failed"
    assert "try 4" in SENT[0]["message"] and "boom" in SENT[0]["message"]


def test_a_challenger_held_for_review_alerts(tmp_path):
    configure(tmp_path)
    assert review_pending({"version": "7", "promoted": True, "reason": "wins"}, "kale-throughput-model") is False
    assert review_pending({"version": "8", "promoted": False, "reason": "held for review: auto_promote is off"},
                          "kale-throughput-model") is True
    assert [s["kind"] for s in SENT] == ["review_pending"]
    assert "v8 waits for review" in SENT[0]["subject"] and "auto_promote is off" in SENT[0]["message"]


def test_without_a_notifier_alerts_are_logged_only(caplog):
    with caplog.at_level(logging.WARNING):
        assert Alerter().send("slo_risk", "title", "the lag is high") is False
    assert "kale alert [slo_risk] title: the lag is high" in caplog.text and SENT == []


def test_a_broken_channel_is_logged_and_never_raises(caplog):
    alerter = Alerter(AlertsConfig(notifier="tests.control.test_alerts.BrokenNotifier"))
    with caplog.at_level(logging.ERROR):
        assert alerter.send("task_failed", "t", "m") is False
    assert "could not be delivered" in caplog.text and "SMTP server down" in caplog.text


def test_the_smtp_notifier_path_from_the_docs_imports():
    notifier = Alerter(AlertsConfig(notifier="airflow.providers.smtp.notifications.smtp.SmtpNotifier",
                                    notifier_kwargs={"to": "oncall@example.com"})).notifier()
    assert type(notifier).__name__ == "SmtpNotifier"
