"""Run DAGs for real with ``dag.test()`` in a throwaway AIRFLOW_HOME (subprocess per run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAGS = ROOT / "dags"

RUNNER = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.get_dag(sys.argv[2])
if len(sys.argv) > 4:  # the retries to run with (0: the try a failure leaves once the DAG's retries are spent)
    from datetime import timedelta
    for t in dag.tasks:  # 1 s apart: dag.test() sleeps through each retry delay, which is no test's subject
        t.retries, t.retry_delay, t.retry_exponential_backoff = int(sys.argv[4]), timedelta(seconds=1), 0
dr = dag.test(run_conf=json.loads(sys.argv[3]))
states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
print("KALE_RESULT" + json.dumps({"state": str(dr.state), "tasks": states}))
"""


@dataclass
class DagRun:
    state: str
    tasks: dict
    log: str


@dataclass
class AirflowHome:
    path: Path
    env: dict

    @property
    def kale_home(self) -> Path:
        return Path(self.env["KALE_HOME"])

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.kale_home / 'mlflow.db'}"

    def run(self, dag_id: str, conf: dict | None = None, extra_env: dict | None = None, timeout=600,
            dags: Path = DAGS, retries: int | None = None) -> DagRun:
        """``retries``: run every task with that many retries, 1 s apart, instead of the DAG's
        (dag.test() waits out each retry delay)."""
        env = self.env | {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)} | (extra_env or {})
        argv = [str(dags), dag_id, json.dumps(conf or {})] + ([] if retries is None else [str(retries)])
        proc = subprocess.run([sys.executable, "-c", RUNNER, *argv],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=self.path)
        out = proc.stdout + proc.stderr
        line = next((l for l in proc.stdout.splitlines() if l.startswith("KALE_RESULT")), None)
        assert line, f"dag.test crashed:\n{out[-5000:]}"
        res = json.loads(line[len("KALE_RESULT"):])
        return DagRun(res["state"], res["tasks"], out)


def base_env(home: Path) -> dict:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return keep | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "KALE_HOME": str(home / "kale"),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "PYTHONWARNINGS": "ignore",
        "GIT_PYTHON_REFRESH": "quiet",
    }


def migrated_template(root: Path) -> Path:
    """An AIRFLOW_HOME with a migrated metadata DB (made once, then copied)."""
    home = root / "template"
    if not (home / "airflow.db").exists():
        home.mkdir(parents=True, exist_ok=True)
        airflow = Path(sys.executable).parent / "airflow"
        subprocess.run([str(airflow), "db", "migrate"], env=base_env(home), check=True, capture_output=True,
                       timeout=600)
    return home


def fresh_home(template: Path, dest: Path) -> AirflowHome:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(template / "airflow.db", dest / "airflow.db")
    return AirflowHome(dest, base_env(dest))
