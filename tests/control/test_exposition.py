"""The autoscaler's decisions as Prometheus metrics: recorded in-process, and exported from
the control-plane database by the decision exporter process (``python -m
kale_airflow.control.exposition``) that a real Prometheus server scrapes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import generate_latest

from kale_airflow.control.exposition import DecisionMetrics
from kale_airflow.core.policies import Decision, Observation, Reason
from kale_airflow.store import StateStore
from tests.prometheus_harness import ROOT, PrometheusServer, free_port, prometheus_binary, stop_process, wait_for


def series(text: str, name: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.prometheus
def test_a_decision_sets_the_gauges_and_counts_its_reason():
    m = DecisionMetrics()
    details = {"plan_workers": 6, "plan_gpu_h": 12.5, "stay_gpu_h": 14.0, "planned_rate": 5000.0, "forecast_peak": 5400.0,
               "source": "model"}
    m.record(Decision(6, Reason.SCALE_UP_SLO_RISK, "lag", details), Observation(10.0, 4, 4000.0, 9e4, 200.0, None,
                                                                            3900.0, False, 3),
             capacity=4100.0, slo_s=300.0, forecast_quantile=0.9)
    m.record(Decision(6, Reason.HOLD, "", details), Observation(20.0, 6, 4000.0, 0.0, 1.0), slo_s=300.0)
    body = generate_latest(m.registry)
    check = subprocess.run([prometheus_binary("promtool"), "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = body.decode()
    assert series(text, "kale_autoscaler_desired_workers") == 6
    assert series(text, "kale_autoscaler_running_workers") == 6
    assert series(text, 'kale_autoscaler_decisions_total{reason="scale_up_slo_risk"}') == 1
    assert series(text, 'kale_autoscaler_decisions_total{reason="hold"}') == 1
    assert series(text, 'kale_autoscaler_decision_reason{reason="hold"}') == 1
    assert series(text, 'kale_autoscaler_decision_reason{reason="scale_up_slo_risk"}') == 0
    assert series(text, 'kale_autoscaler_rescales_total{direction="up"}') == 1
    assert series(text, 'kale_autoscaler_forecast_samples_per_second{q="0.9"}') == 5400
    assert series(text, "kale_autoscaler_required_capacity_samples_per_second") == 5000
    assert series(text, "kale_autoscaler_plan_workers") == 6
    assert series(text, 'kale_autoscaler_plan_cost_gpu_seconds{plan="move"}') == 12.5 * 3600
    assert series(text, 'kale_autoscaler_plan_cost_gpu_seconds{plan="stay"}') == 14 * 3600
    assert series(text, "kale_autoscaler_slo_at_risk") == 0  # 1 s of lag now
    assert series(text, "kale_autoscaler_freshness_slo_seconds") == 300
    assert str(series(text, "kale_autoscaler_ready_workers")) == "nan"  # unknown now, not zero


@pytest.mark.prometheus
def test_the_exporter_process_exports_recorded_decisions_to_prometheus(tmp_path):
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    store = StateStore(url)
    store.record_decision(time.time(), 0, {"workers": 2, "reason": "scale_up_forecast", "message": "start",
                                           "plan_workers": 2, "forecast_peak": 900.0})
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KALE_HOME": str(tmp_path), "KALE_DATABASE_URL": url}
    env.pop("KALE_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "kale_airflow.control.exposition", "--port", str(port),
                             "--addr", "127.0.0.1", "--interval", "0.3"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read(), 60,
                 "the exporter")
        with PrometheusServer({"kale-autoscaler": [f"127.0.0.1:{port}"]}) as server:
            wait_for(lambda: server.query("kale_autoscaler_desired_workers == 2"), 30, "the first decision")
            for i in range(3):  # decisions recorded while the exporter runs are counted once each
                store.record_decision(time.time(), 2, {"workers": 2, "reason": "hold_stabilizing", "message": "",
                                                       "freshness_lag_s": 200.0, "arrival_rate": 800.0})
            store.record_decision(time.time(), 2, {"workers": 3, "reason": "scale_up_slo_risk", "message": "",
                                                   "freshness_lag_s": 200.0, "capacity": 1000.0})
            wait_for(lambda: server.query("kale_autoscaler_desired_workers == 3"), 30, "the last decision")
            got = {r["metric"]["reason"]: float(r["value"][1])
                   for r in server.query("kale_autoscaler_decisions_total > 0")}
            assert got == {"scale_up_forecast": 1, "hold_stabilizing": 3, "scale_up_slo_risk": 1}
            assert float(server.query('kale_autoscaler_rescales_total{direction="up"}')[0]["value"][1]) == 1
            assert float(server.query("kale_autoscaler_slo_at_risk")[0]["value"][1]) == 1
            # the deployment's default SLO (300 s) comes from the configuration
            assert float(server.query("kale_autoscaler_freshness_slo_seconds")[0]["value"][1]) == 300
    finally:
        stop_process(proc)
        err = proc.stderr.read().decode()
        assert "Traceback" not in err, err
