"""Every DAG file parses in a throwaway AIRFLOW_HOME with no import errors and without
importing torch, neuralprophet or mlflow at top level (parse time must stay light)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
HEAVY = ("torch", "neuralprophet", "mlflow")

CHECK = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import os
from airflow.dag_processing.dagbag import DagBag
for config in sys.argv[2:] or [""]:  # one parse per deployment file ("": none), in one interpreter
    if config:
        os.environ["KALE_CONFIG"] = config
    bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
    heavy = sorted(m for m in {"torch", "neuralprophet", "mlflow", "scipy.optimize"} if m in sys.modules)
    print("RESULT" + json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()},
                                 "dags": sorted(bag.dag_ids), "heavy": heavy}))
"""


def parse_dags(folder: Path, airflow_home: Path, configs: tuple = ()) -> dict | list[dict]:
    """The DAGs of ``folder`` as parsed without a deployment file, or once per file of
    ``configs`` (then a list, in order), in one interpreter."""
    env = {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", CHECK, str(folder), *map(str, configs)], capture_output=True,
                         text=True, env=env, timeout=300)
    lines = [json.loads(line[len("RESULT"):]) for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert len(lines) == max(1, len(configs)), f"DAG parse crashed:\n{out.stdout}\n{out.stderr}"
    return lines if configs else lines[0]


PLAIN = ["kale_autoscaler", "kale_forecaster_retrain", "kale_throughput_refit", "kale_training"]


def test_project_dags_import_cleanly_and_stay_light_one_set_per_job(tmp_path):
    """Bug classes: an import error, a heavy import at parse time, a single-job deployment's
    DAG ids changing, one set of DAGs for a fleet (a job's DAGs missing, ids that collide)."""
    single, fleet = tmp_path / "single.yaml", tmp_path / "fleet.yaml"
    single.write_text(json.dumps({"max_workers": 4}))
    fleet.write_text(json.dumps({"stream_url": "sqlite:///s.db", "fleet": {"gpus": 8}, "jobs": [
        {"name": "ranking", "stream_url": "sqlite:///ranking.db"}, {"name": "ads", "stream_url": "sqlite:///ads.db"}]}))
    plain, jobs = parse_dags(DAGS, tmp_path, (single, fleet))
    for result in (plain, jobs):
        assert result["errors"] == {}
        assert result["heavy"] == []
    assert plain["dags"] == PLAIN
    assert jobs["dags"] == sorted(f"{base}__{job}" for base in PLAIN for job in ("ranking", "ads"))


@pytest.mark.slow
def test_guard_flags_a_dag_that_imports_a_heavy_library(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "heavy_dag.py").write_text(
        "import json\nimport mlflow  # heavy at parse time\n"
        "from airflow.sdk import dag\n\n@dag(schedule=None)\ndef heavy():\n    pass\n\nheavy()\n"
    )
    (folder / "broken_dag.py").write_text("from airflow.sdk import dag\nimport not_a_module_xyz\n")
    result = parse_dags(folder, tmp_path / "home")
    assert "mlflow" in result["heavy"]
    assert any("broken_dag.py" in k for k in result["errors"])


NO_VARIABLES = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import airflow.sdk
calls = []
def get(key, *args, **kwargs):
    calls.append(key)
    raise AssertionError(f"Variable.get({key!r}) at parse time")
airflow.sdk.Variable.get = staticmethod(get)
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
print("RESULT" + json.dumps({"calls": calls, "errors": {k: str(v) for k, v in bag.import_errors.items()},
                             "schedules": {d: str(bag.dags[d].schedule) for d in bag.dag_ids},
                             "retries": {d: bag.dags[d].default_args.get("retries") for d in bag.dag_ids},
                             "shadow_param": "shadow" in bag.dags["kale_autoscaler"].params}))
"""


def test_schedules_come_from_the_environment_without_variable_reads(tmp_path):
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__UNIT_TEST_MODE": "True", "PATH": "/usr/bin:/bin",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db",
           "AIRFLOW_VAR_KALE_THROUGHPUT_REFIT_SCHEDULE": "@daily"}
    out = subprocess.run([sys.executable, "-c", NO_VARIABLES, str(DAGS)], capture_output=True, text=True, env=env,
                         timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[len("RESULT"):])
    assert res["calls"] == [] and res["errors"] == {}
    assert res["schedules"]["kale_throughput_refit"] == "@daily"  # AIRFLOW_VAR_* route
    assert res["schedules"]["kale_autoscaler"] == "@continuous"  # the default
    assert res["retries"] == {"kale_autoscaler": 2, "kale_forecaster_retrain": 2,
                              "kale_throughput_refit": 2, "kale_training": 2}
    assert res["shadow_param"]
