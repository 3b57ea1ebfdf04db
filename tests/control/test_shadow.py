"""Shadow mode: a poke loop beside an autoscaler in charge (an "HPA" whose workers write
heartbeats) records every decision with ``applied: false`` and the count that really ran,
starts nothing, and ``kale status`` and the Kale page compare both trajectories.
Dry runs (``kale decide --dry-run``) write nothing at all."""

import pytest
import yaml

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.control.autoscaler import STATE_KEY, Autoscaler
from kale_airflow.control.shadow import compare, observed_workers
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.stream.embedded import EmbeddedStream
from tests.control.test_autoscaler import NOW, FakeChampions, arrive

POLL = 15.0


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A Kale home on SQLite whose deployment file turns shadow mode on."""
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_MLFLOW_URI", f"sqlite:///{tmp_path}/mlflow.db")
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    settings = {"stream_url": f"sqlite:///{tmp_path / 'stream.db'}", "poll_interval_s": POLL, "bin_s": 60,
                "max_workers": 16, "slo_s": 300, "shadow": True}
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump(settings))
    stream = EmbeddedStream(tmp_path / "stream.db", partitions=4)
    yield tmp_path, stream, settings
    from kale_airflow.store.database import forget_databases

    forget_databases()


def make(home, **override) -> Autoscaler:
    tmp, stream, settings = home
    dep = Deployment(**(settings | override))
    cfg = Config(Settings(tmp, f"sqlite:///{tmp / 'mlflow.db'}"), dep)
    return Autoscaler(cfg, stream=stream, registry=FakeChampions())


def hpa_runs(auto, workers: int, now: float, total: int = 6) -> None:
    """The autoscaler in charge runs ``workers`` workers: their heartbeats (the others stopped)."""
    for w in range(total):
        auto.state.worker_seen("hpa", w, "running" if w < workers else "stopped", now=now)


def test_shadow_poke_loop_records_every_decision_unapplied_and_starts_nothing(home, monkeypatch):
    auto = make(home)
    assert auto.shadow
    hpa = [2] * 8 + [5] * 8  # the autoscaler in charge is late: 2 workers for 4,500 samples/s, then 5
    for i, running in enumerate(hpa):
        t = NOW + POLL * i
        hpa_runs(auto, running, t)
        arrive(home[1], 4500, seconds=POLL, end=t)
        decision, obs = auto.poke(t)
        assert obs.workers == running and auto.workers_source == "heartbeats"

    recorded = auto.state.decisions()
    assert len(recorded) == len(hpa)
    assert all(d["applied"] is False and d["shadow"] is True for d in recorded)
    assert [d["workers"] for d in recorded] == hpa  # what actually ran, next to Kale's decision
    assert {d["workers_source"] for d in recorded} == {"heartbeats"}
    assert any(d["target"] > d["workers"] for d in recorded[:8])  # Kale would have scaled up earlier
    assert auto.state.current() is None and auto.state.current_generation() is None  # nothing applied

    # the scale task starts nothing for a shadow decision (and with `shadow: true` configured)
    from kale_airflow.operators.scale import ScaleWorkersOperator

    event = {"status": "scale", "current": 2, "shadow": True, "workers": 5, "reason": "scale_up_forecast",
             "message": "m"}
    for decision in (event, {k: v for k, v in event.items() if k != "shadow"}):
        out = ScaleWorkersOperator(task_id="scale_workers", decision=decision).execute({"run_id": "r1"})
        assert out["skip"] is True and out["shadow"] is True
    assert auto.state.current_generation() is None

    # the comparison: GPU-hours of what ran against what Kale decided
    cmp = compare(recorded, gpus_per_worker=1, poll_interval_s=POLL, slo_s=300)
    ran_hours = sum(w * POLL for w in hpa[:-1]) / 3600
    assert cmp["ran"]["gpu_hours"] == pytest.approx(ran_hours)
    assert cmp["kale"]["gpu_hours"] == pytest.approx(sum(d["target"] * POLL for d in recorded[:-1]) / 3600)
    assert cmp["ran"]["max_lag_s"] is not None and cmp["kale"]["max_lag_s"] is not None
    assert cmp["kale"]["max_lag_s"] <= cmp["ran"]["max_lag_s"]  # scaling earlier drains sooner

    # kale status shows both
    from kale_airflow.cli.ops import format_status, status

    doc = status(now=NOW + POLL * len(hpa), models=False)
    assert doc["config"]["shadow"] is True
    assert doc["shadow"]["ran"]["gpu_hours"] == pytest.approx(ran_hours)
    assert doc["workers"]["running"] == 5 and doc["workers"]["by_generation"] == {"hpa": [0, 1, 2, 3, 4]}
    text = format_status(doc)
    assert "shadow comparison over 16 decisions" in text and "[shadow, not applied]" in text
    assert "ON (decide and record, never apply)" in text

    # and so does the Kale page
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.core_api.security import get_user
    from kale_airflow.ui import app as ui

    ui.app.dependency_overrides[get_user] = lambda: object()
    ui.app.dependency_overrides[ui.can_read_kale] = lambda: None  # access is tests/ui's subject, not this one's
    monkeypatch.setattr(ui, "_models", lambda cfg, job="default": [])  # no MLflow round trip here (restored after)
    try:
        page = TestClient(ui.app).get("/").text
        state = TestClient(ui.app).get("/api/state").json()
    finally:
        ui.app.dependency_overrides.clear()
    assert "Shadow mode" in page and "shadow: not applied" in page and "Kale (shadow, not applied)" in page
    assert state["shadow"]["ran"]["gpu_hours"] == pytest.approx(ran_hours)


def test_the_shadow_param_overrides_the_configuration(home):
    assert not make(home, shadow=False).shadow
    tmp, stream, settings = home
    auto = Autoscaler(Config(Settings(tmp, "sqlite:///x"), Deployment(**(settings | {"shadow": False}))),
                      stream=stream, registry=FakeChampions(), shadow=True)
    assert auto.shadow


def test_worker_count_sources_in_order(home):
    auto = make(home)
    metrics = EmbeddedMetrics(auto.settings.database_url)
    # nothing known
    assert observed_workers(NOW, pods=None, store=auto.state, metrics=metrics, fresh_s=120) == (None, "unknown")
    # recorded throughput observations
    metrics.write_throughput([NOW - 10], [3], [3000.0])
    assert observed_workers(NOW, pods=None, store=auto.state, metrics=metrics, fresh_s=120) == (3, "throughput "
                                                                                                  "observations")
    # fresh heartbeats win over observations; stale ones do not count
    hpa_runs(auto, 4, NOW - 500)
    assert observed_workers(NOW, pods=None, store=auto.state, metrics=metrics, fresh_s=120)[1] == "throughput " \
                                                                                                   "observations"
    hpa_runs(auto, 4, NOW - 5)
    assert observed_workers(NOW, pods=None, store=auto.state, metrics=metrics, fresh_s=120) == (4, "heartbeats")
    # Running pods win over everything
    assert observed_workers(NOW, pods=lambda: 6, store=auto.state, metrics=metrics, fresh_s=120) == (6, "pods")


def test_a_dry_run_writes_nothing(home):
    auto = make(home, shadow=False)
    arrive(home[1], 3500, seconds=120.0)
    decision, obs = auto.poke(NOW, record=False)
    assert decision.reason.value == "scale_up_forecast" and decision.workers >= 3 and obs.workers == 0  # decided
    assert auto.state.decisions() == []  # ... and not recorded
    assert auto.state.get_value(STATE_KEY) is None
    from kale_airflow.metrics.embedded import MetricsError

    with pytest.raises(MetricsError, match="no traffic"):  # no traffic bin written either
        EmbeddedMetrics(auto.settings.database_url).traffic_history(1)
    assert auto.state.current_generation() is None
