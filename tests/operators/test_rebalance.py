"""RebalanceShardsOperator inside a real DAG run (dag.test), then again in process: sticky
across generations, idempotent per generation, start offsets committed before publishing."""

import json

import pytest

from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.store import StateStore

pytestmark = pytest.mark.slow

DAG = '''
from datetime import datetime
from airflow.sdk import dag
from kale_airflow.operators.rebalance import RebalanceShardsOperator

@dag(dag_id="rebalance_probe", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     params={"workers": 4, "generation": "g1"})
def probe():
    RebalanceShardsOperator(task_id="rebalance", workers="{{ params.workers }}",
                            generation="{{ params.generation }}")

probe()
'''


@pytest.fixture
def dag_folder(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "probe.py").write_text(DAG)
    return folder


@pytest.fixture
def rebalance(airflow_home, monkeypatch, capfd):
    """The operator of the probe DAG run again in this process (its later runs: Airflow's own
    start, template rendering and XCom were exercised by the first run, in a real dag.test)."""
    from kale_airflow.operators.rebalance import RebalanceShardsOperator

    monkeypatch.setenv("KALE_HOME", str(airflow_home.kale_home))
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)

    def run(workers: int, generation: str) -> tuple[dict, str]:
        capfd.readouterr()
        out = RebalanceShardsOperator(task_id="rebalance", workers=workers, generation=generation).execute(
            {"run_id": f"manual__{generation}"})
        return out, capfd.readouterr().out  # the task's log lines (Airflow's logging writes them to stdout)
    return run


def test_assigns_each_generation_sticky_and_idempotent(airflow_home, dag_folder, rebalance):
    metrics = EmbeddedMetrics(airflow_home.kale_home / "kale.db")
    metrics.write_partition_rates(1.0, {"a": 900.0, "b": 50.0, "c": 30.0, "d": 20.0})
    r1 = airflow_home.run("rebalance_probe", {"workers": 4, "generation": "g1"}, dags=dag_folder)
    assert r1.state == "success", r1.log[-3000:]
    store = StateStore(airflow_home.kale_home / "kale.db")
    g1 = store.get("default", "g1")
    assert g1["workers"] == 4 and g1["imbalance"] == pytest.approx(1.0)
    hot = [w for w, items in g1["assignment"].items() for p, s in items if p == "a"]
    assert len(hot) >= 3  # the hot partition is sliced

    summary, log = rebalance(5, "g2")
    g2 = store.get("default", "g2")
    assert summary["workers"] == 5 and g2["moved_fraction"] == pytest.approx(1 / 5, rel=1e-6)
    assert "from generation g1 (4 workers): moved 20.00% of the rate (minimum 20.00%)" in log

    # Re-running g2 (a retry) changes nothing.
    _, log = rebalance(5, "g2")
    assert "already assigned" in log
    assert store.get("default", "g2") == g2

    # The same generation with another worker count is refused with the way out.
    from kale_airflow.control.generations import GenerationError

    with pytest.raises(GenerationError, match="start a new generation"):
        rebalance(6, "g2")
    assert json.dumps(store.get("default", "g2")) == json.dumps(g2)


def test_new_slices_have_their_start_offsets_before_the_assignment_is_published(airflow_home, dag_folder,
                                                                                  rebalance):
    from kale_airflow.core.slices import slices_for
    from kale_airflow.stream.embedded import EmbeddedStream

    stream = EmbeddedStream(airflow_home.kale_home / "stream.db", partitions=3)
    for p, n in ((0, 3000), (1, 200), (2, 100)):  # partition 0 is hot: it gets sliced
        stream.append(p, [b"x"] * n)
    r1 = airflow_home.run("rebalance_probe", {"workers": 2, "generation": "g1"}, dags=dag_folder)
    assert r1.state == "success", r1.log[-3000:]
    store = StateStore(airflow_home.kale_home / "kale.db")
    g1 = store.get("default", "g1")
    for w in g1["assignment"]:  # the first generation trains everything so far
        for sl in slices_for(g1, int(w)):
            stream.commit(f"kale/{sl.group_suffix}", {sl.partition: stream.end_offsets()[sl.partition]})

    _, log = rebalance(3, "g2")
    g2 = store.get("default", "g2")
    ends = stream.end_offsets()
    for w in g2["assignment"]:  # no slice of the new generation would re-read what g1 trained
        for sl in slices_for(g2, int(w)):
            assert stream.committed(f"kale/{sl.group_suffix}", sl.partition) == ends[sl.partition], sl
    assert "handover:" in log
