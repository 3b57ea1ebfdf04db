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
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
heavy = sorted(m for m in {"torch", "neuralprophet", "mlflow"} if m in sys.modules)
print("RESULT" + json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()},
                             "dags": sorted(bag.dag_ids), "heavy": heavy}))
"""


def parse_dags(folder: Path, airflow_home: Path) -> dict:
    env = {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", CHECK, str(folder)], capture_output=True, text=True, env=env,
                         timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, f"DAG parse crashed:\n{out.stdout}\n{out.stderr}"
    return json.loads(line[len("RESULT"):])


def test_project_dags_import_cleanly_and_stay_light(tmp_path):
    result = parse_dags(DAGS, tmp_path)
    assert result["errors"] == {}
    assert result["heavy"] == []


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
