"""Run DAGs for real with ``dag.test()`` in a throwaway AIRFLOW_HOME (one subprocess per home)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAGS = ROOT / "dags"

# The DAG runs of one AirflowHome, in order, in one long-lived ``dag.test`` process (argv: the
# log file, the DAG folder): one JSON line [dag_id, conf, retries] each on the command pipe, one JSON result line back.
# Airflow's start (its imports, the in-process execution API, MLflow's import: 5-10 s) is paid
# once per home instead of once per run. Airflow logs to fds 1 and 2, which go to the log file
# (argv[1]); the results go back on the original stdout, and the commands come on the original
# stdin, both on private descriptors that no process a task starts inherits. ``retries``: run
# every task with that many retries, 1 s apart (dag.test() sleeps through each retry delay,
# which is no test's subject); null keeps the DAG's.
DAG_SERVER = r"""
import json, os, sys, traceback
commands = os.fdopen(os.dup(0), "r")
results = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
log = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.dup2(log, 1)
os.dup2(log, 2)
from datetime import timedelta
from airflow.dag_processing.dagbag import DagBag
for line in commands:
    dag_id, conf, retries = json.loads(line)
    try:
        bag = DagBag(dag_folder=sys.argv[2])
        assert not bag.import_errors, bag.import_errors
        dag = bag.get_dag(dag_id)
        if retries is not None:
            for t in dag.tasks:
                t.retries, t.retry_delay, t.retry_exponential_backoff = retries, timedelta(seconds=1), 0
        dr = dag.test(run_conf=conf)
        res = {"state": str(dr.state), "tasks": {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}}
    except BaseException:
        traceback.print_exc()
        res = None
    sys.stdout.flush()
    sys.stderr.flush()
    results.write(json.dumps(res) + "\n")
    results.flush()
os._exit(0)  # no interpreter shutdown: its collection of Airflow's heap takes seconds
"""


@dataclass
class DagRun:
    state: str
    tasks: dict
    log: str


class AirflowHome:
    """A throwaway AIRFLOW_HOME whose DAG runs share one ``dag.test`` process (``DAG_SERVER``),
    started at the first run with the environment as it is then (a run after ``env`` changed,
    or with ``extra_env``, starts another); :meth:`close` ends it. What carries over between
    runs is what the stores persist, as between a deployment's task runs: each run parses the
    DAG folder again and builds its own objects."""

    def __init__(self, path: Path, env: dict):
        self.path, self.env = path, env
        self.log_path = path / "dag-runs.log"
        self._proc: subprocess.Popen | None = None
        self._proc_env: dict | None = None

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
        env = self.env | (extra_env or {}) | {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
        if self._proc is None or self._proc_env != env:
            self.close()
            self._proc_env = env
            self._proc = subprocess.Popen([sys.executable, "-c", DAG_SERVER, str(self.log_path), str(dags)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                          env=env, cwd=self.path)
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._proc.stdin.write(json.dumps([dag_id, conf or {}, retries]) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        line = self._proc.stdout.readline() if ready else ""
        with open(self.log_path, errors="replace") as fh:
            fh.seek(start)
            out = fh.read()
        if not line:
            self.close()
        res = json.loads(line) if line else None
        assert res, f"dag.test crashed or ran past {timeout} s:\n{out[-5000:]}"
        return DagRun(res["state"], res["tasks"], out)

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, 9)
                proc.wait()


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
