"""The retrain and refit DAGs as Airflow parses and serializes them (fast; the runs are in
test_model_dags.py): retries and the failure alert on every task, no retry for errors no
retry can fix, and the promotion's Asset outlet in the serialized graph the UI draws."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
MODEL_DAGS = ("kale_forecaster_retrain", "kale_throughput_refit")

INSPECT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.exceptions import AirflowFailException
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}}
for dag_id in sys.argv[2:]:
    dag = bag.dags[dag_id]
    graph = DagSerialization.from_dict(DagSerialization.to_dict(dag))  # what the scheduler and the UI read
    out[dag_id] = {
        "outlets": {t.task_id: [a.uri for a in t.outlets] for t in graph.tasks if t.outlets},
        "announce_upstream": sorted(dag.get_task("announce_champion").upstream_task_ids),
        "retries": {t.task_id: t.retries for t in dag.tasks},
        "on_failure": {t.task_id: [f.__module__ + "." + f.__name__ for f in t.on_failure_callback or []]
                       for t in dag.tasks},
    }
autoscaler = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["kale_autoscaler"]))
out["autoscaler_inlets"] = {t.task_id: [a.uri for a in t.inlets] for t in autoscaler.tasks if t.inlets}
start = bag.dags["kale_autoscaler"].get_task("start_generation")
out["start_generation"] = {"run_id": start.trigger_run_id, "skip_existing": start.skip_when_already_exists,
                           "upstream": sorted(start.upstream_task_ids)}
validate = bag.dags["kale_forecaster_retrain"].get_task("validate").python_callable
try:
    validate({"path": "/nonexistent/traffic.csv"}, params={"horizon_minutes": 60, "test_days": 1})
    out["validate_error"] = None
except Exception as exc:
    out["validate_error"] = [type(exc).__name__, isinstance(exc, AirflowFailException), str(exc)]
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", INSPECT, str(DAGS), *MODEL_DAGS], capture_output=True, text=True,
                          env=env, timeout=300)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(line[len("RESULT"):])
    assert res["errors"] == {}
    return res


@pytest.mark.parametrize("dag_id, uri", [("kale_forecaster_retrain", "kale://models/forecaster"),
                                         ("kale_throughput_refit", "kale://models/throughput")])
def test_the_promotion_task_emits_the_models_asset_in_the_serialized_graph(parsed, dag_id, uri):
    assert parsed[dag_id]["outlets"] == {"announce_champion": [uri]}  # no other task claims the asset
    assert parsed[dag_id]["announce_upstream"] == ["promote_or_hold"]  # it announces the review's outcome


def test_the_autoscaler_declares_the_model_assets_it_reloads_on(parsed):
    assert parsed["autoscaler_inlets"] == {"wait_for_decision": ["kale://models/forecaster",
                                                                 "kale://models/throughput"]}


def test_a_generation_is_triggered_once_under_an_id_its_retries_share(parsed):
    """Bug class: ``start_generation`` retried after its trigger went through starting a
    second training run of the same generation (an id made at trigger time differs per try)."""
    start = parsed["start_generation"]
    assert start["run_id"] == "{{ run_id }}__{{ ti.xcom_pull(task_ids='scale_workers')['generation'] }}"
    assert start["skip_existing"] is True and start["upstream"] == ["changed"]  # and only if scale_workers says so


@pytest.mark.parametrize("dag_id", MODEL_DAGS)
def test_every_task_retries_transient_faults_and_alerts_when_it_fails_for_good(parsed, dag_id):
    tasks = parsed[dag_id]
    assert set(tasks["retries"].values()) == {2}, tasks["retries"]
    assert all(cbs == ["kale_airflow.control.alerts.task_failure_callback"] for cbs in tasks["on_failure"].values()), \
        tasks["on_failure"]


def test_bad_traffic_history_fails_the_retrain_without_retries(parsed):
    """A TraceError stays a TraceError on the next try: the task must raise AirflowFailException
    (Airflow then skips the two retries) with the message kept."""
    name, no_retry, message = parsed["validate_error"]
    assert (name, no_retry) == ("KaleFailure", True)
    assert "/nonexistent/traffic.csv does not exist" in message and "not retried" in message
