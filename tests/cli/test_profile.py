"""``kale profile`` on the embedded default: it runs the real training job at each world size
(local worker processes, started by the job supervisor) and their rank 0 records throughput
in the control plane; a stream without samples is refused with the producer to run."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from kale_airflow.cli.main import main
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream


@pytest.fixture
def kale_home(tmp_path, monkeypatch):
    """An embedded deployment whose ranks emulate a short step (64 samples per 20 ms: about
    3,200 samples/s each), so a small stream lasts the profile and two cores host both sizes."""
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID", "KALE_METRICS_SOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KALE_WORKER_THREADS", "1")
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump({"worker_batch_size": 64, "worker_step_time_s": 0.02}))
    yield tmp_path
    from kale_airflow.store.database import forget_databases

    forget_databases()


def test_an_empty_stream_is_refused_with_the_producer_to_run_and_nothing_recorded(kale_home, capsys):
    EmbeddedStream(kale_home / "stream.db", partitions=4)
    assert main(["profile", "--workers", "1,2", "--seconds-per-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds no samples" in err and "record no throughput" in err
    assert f"python -m kale_airflow.runtime.producer --stream sqlite:///{kale_home}/stream.db" in err
    assert EmbeddedMetrics(f"sqlite:///{kale_home}/kale.db").throughput_observations().empty


@pytest.mark.slow
def test_profile_records_the_jobs_own_throughput_at_each_size(kale_home, capsys):
    from kale_airflow.runtime.samples import generate, pack

    stream = EmbeddedStream(kale_home / "stream.db", partitions=4)
    for p in range(4):  # an even backlog: 60,000 samples, about 9 s of the 2-rank job
        for chunk in range(3):
            stream.append(p, pack(generate(5000, 10 * p + chunk)))
    db = f"sqlite:///{kale_home}/kale.db"
    StateStore(db).set_current_generation("g-old", 3)  # a profiling job is no generation: not superseded
    t0 = time.time()
    assert main(["profile", "--workers", "1,2", "--seconds-per-size", "3", "--json", str(kale_home / "p.json")]) == 0
    out = capsys.readouterr().out
    obs = EmbeddedMetrics(db).throughput_observations()
    assert set(obs["workers"]) == {1, 2} and (obs["ts"] > t0).all() and (obs["rate"] > 0).all()
    doc = json.loads((kale_home / "p.json").read_text())
    assert [(s["workers"], s["observations"]) for s in doc["sizes"]] == [
        (n, int((obs["workers"] == n).sum())) for n in (1, 2)]
    for s in doc["sizes"]:  # the emulated step bounds each rank near 3,200 samples/s
        assert s["observations"] >= 1 and 0 < s["samples_per_s"] < 3_500 * s["workers"], s
    assert "[1/2] 1 worker(s): starting the job" in out and "[2/2] 2 worker(s):" in out
    assert "workers     samples/s  per worker  observations" in out
    assert "Next: fit the throughput model on them: airflow dags trigger kale_throughput_refit" in out
    logs = sorted(p.name for p in (kale_home / "worker-logs").glob("profile-*-worker-*.log"))
    assert len(logs) == 3  # the real ranks: one job of 1, one of 2
    assert "joined a job of 2 rank(s)" in next((kale_home / "worker-logs").glob("profile-*-2w-worker-1.log")).read_text()
    store = StateStore(db)
    assert store.running_workers() == [] and store.current_generation() == "g-old"  # no heartbeat, nothing named
    assert not any((kale_home / "profile").iterdir())  # the profile's checkpoints are thrown away
