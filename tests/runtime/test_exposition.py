"""The worker's /metrics (runtime.exposition): served over HTTP, named by Prometheus'
conventions (``promtool check metrics``), and scraped from a real worker process by a real
Prometheus server."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest

from kale_airflow.runtime.exposition import WorkerMetrics
from tests.prometheus_harness import PrometheusServer, free_port, prometheus_binary, start_process, stop_process, \
    wait_for


def promtool_check(text: bytes) -> None:
    proc = subprocess.run([prometheus_binary("promtool"), "check", "metrics"], input=text, capture_output=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read()


def value(text: str, series: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.prometheus
def test_worker_metrics_are_served_and_pass_promtool():
    m = WorkerMetrics()
    port = m.serve(0, addr="127.0.0.1", worker=3, generation="g7", workers=4, restored=True, job="ads")
    try:
        for _ in range(4):
            m.observe_step(128, 0.5, lag={"0/0": 300, "1/0": 20}, malformed=1)
        m.observe_step(0, 0.01)  # nothing read: not a training step
        body = scrape(port)
    finally:
        m.stop()
    promtool_check(body)
    text, lb = body.decode(), 'generation="g7",kale_job="ads",worker="3",workers="4"'
    assert value(text, f"kale_worker_samples_trained_total{{{lb}}}") == 512
    assert value(text, f"kale_worker_steps_total{{{lb}}}") == 4
    assert value(text, f"kale_worker_step_duration_seconds_count{{{lb}}}") == 4
    assert value(text, f"kale_worker_step_duration_seconds_sum{{{lb}}}") == 2.0
    assert value(text, f"kale_worker_throughput_samples_per_second{{{lb}}}") == 256
    assert value(text, 'kale_worker_consumer_lag_samples{generation="g7",kale_job="ads",slice="0/0",worker="3",workers="4"}') == 300
    assert value(text, f"kale_worker_malformed_samples_total{{{lb}}}") == 4
    assert value(text, f"kale_worker_restores_total{{{lb}}}") == 1
    assert value(text, f"kale_worker_generation_workers{{{lb}}}") == 4


def test_no_port_serves_nothing_but_still_counts(monkeypatch):
    monkeypatch.delenv("KALE_METRICS_PORT", raising=False)
    m = WorkerMetrics()
    assert m.serve(None) is None and m.server is None
    m.observe_step(10, 0.1)
    monkeypatch.setenv("KALE_METRICS_PORT", str(free_port()))
    m2 = WorkerMetrics()
    try:
        port = m2.serve(None, addr="127.0.0.1")
        assert port == int(__import__("os").environ["KALE_METRICS_PORT"]) and b"kale_worker_steps_total" in scrape(port)
    finally:
        m2.stop()


@pytest.mark.prometheus
def test_prometheus_scrapes_a_worker_process():
    port = free_port()
    proc = start_process("worker", str(port), "0", "1", "64", "0.05", port=port)
    try:
        promtool_check(scrape(port))
        with PrometheusServer({"kale-workers": [f"127.0.0.1:{port}"]}) as server:
            res = wait_for(lambda: server.query('increase(kale_worker_samples_trained_total{worker="0"}[3s]) > 0'),
                           30, "samples trained to grow")
            assert res[0]["metric"]["generation"] == "g1" and res[0]["metric"]["workers"] == "1"
            assert server.query("kale_worker_restores_total")[0]["value"][1] == "1"
    finally:
        stop_process(proc)
