"""The Airflow UI command ``kale demo`` prints works as printed: the venv's ``bin`` on PATH
(``kale ui`` starts Airflow's components by name), the repository's DAGs (not an empty
dags_folder that marks every Kale DAG stale), no example DAGs, the demo's Airflow
database and Kale home. Runs the printed command's environment against a small recorded
demo state: what the DAG processor does (serialize the bundles), then Airflow's own API
server app, asked through its REST API with a user token; and the printed command itself,
which starts only the DAG processor and the API server, so nothing decides again."""

import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from kale_airflow.cli.demo import airflow_ui_command
from kale_airflow.store import StateStore
from tests.conftest import wait_until
from tests.stream.conftest import _free_port

ROOT = Path(__file__).resolve().parents[2]
KALE_DAGS = {"kale_autoscaler", "kale_forecaster_retrain", "kale_throughput_refit", "kale_training"}

QUERY = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
client = TestClient(create_app())
auth = {"Authorization": "Bearer " + get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin",
                                                                                          role="admin"))}
dags = client.get("/api/v2/dags", params={"limit": 500}, headers=auth).json()
# A demo run of the training DAG, as `kale demo` leaves one (triggered as from the UI).
made = client.post("/api/v2/dags/kale_training/dagRuns", headers=auth,
                   json={"logical_date": None, "conf": {"workers": 2, "generation": "demo-g1"}})
assert made.status_code == 200, made.text
runs = client.get("/api/v2/dags/kale_training/dagRuns", headers=auth).json()
kale = client.get("/kale/", headers=auth)
print("KALE_UI" + json.dumps({"dags": {d["dag_id"]: d["is_stale"] for d in dags["dags"]},
                               "runs": runs["total_entries"], "kale": kale.status_code, "page": kale.text,
                               "anonymous": client.get("/kale/").status_code}))
"""

def serialized(airflow_db: Path) -> set[str]:
    """The DAG ids the DAG processor has written to the Airflow database."""
    with sqlite3.connect(airflow_db) as db:
        return {dag_id for (dag_id,) in db.execute("SELECT dag_id FROM serialized_dag")}


def parse_printed(line: str) -> tuple[dict, list[str]]:
    """Split the printed shell line into its leading VAR=value assignments and the command."""
    words = shlex.split(line)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("/"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def test_printed_command_names_the_venv_the_dags_and_the_demo_state(tmp_path):
    bin_dir = Path(sys.executable).parent
    env, argv = parse_printed(airflow_ui_command(tmp_path / "airflow", tmp_path / "kale"))
    assert argv == [str(bin_dir / "kale"), "ui"]
    assert env["PATH"] == f"{bin_dir}:$PATH"  # the user's shell expands $PATH
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(ROOT / "dags")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow") and env["KALE_HOME"] == str(tmp_path / "kale")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / 'airflow'}/airflow.db"
    # `kale ui` starts `airflow dag-processor` and `airflow api-server`: this venv's
    path = env["PATH"].replace("$PATH", "/usr/bin:/bin")
    assert shutil.which("kale", path=path) == str(bin_dir / "kale")


def test_paths_with_spaces_and_quotes_survive_the_shell(tmp_path):
    odd = tmp_path / "my demo's $out"
    env, argv = parse_printed(airflow_ui_command(odd / "airflow", odd / "kale", bin_dir=odd / "bin"))
    assert env["AIRFLOW_HOME"] == str(odd / "airflow") and argv[0] == str(odd / "bin" / "kale")
    line = airflow_ui_command(odd / "airflow", odd / "kale", bin_dir=odd / "bin")
    assignments = line[:line.rindex(shlex.quote(str(odd / "bin" / "kale")))]
    out = subprocess.run(["bash", "-c", assignments + "env"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    seen = dict(l.split("=", 1) for l in out.stdout.splitlines() if "=" in l)
    assert seen["PATH"] == f"{odd / 'bin'}:/usr/bin:/bin" and seen["KALE_HOME"] == str(odd / "kale")


@pytest.mark.slow
def test_printed_environment_serves_the_kale_dags_runs_and_page(airflow_home, tmp_path):
    """A recorded demo state (migrated Airflow DB, a Kale decision log, a kale_training run),
    opened with exactly the printed environment: the four Kale DAGs, not stale, no example
    DAG, the run listed, and the Kale page with a user token."""
    demo_airflow, kale_home = airflow_home.path, tmp_path / "kale"
    StateStore(kale_home / "kale.db").record_decision(time.time(), 2, {
        "workers": 3, "reason": "scale_up_forecast", "message": "the evening peak is coming"})
    env, argv = parse_printed(airflow_ui_command(demo_airflow, kale_home))
    env["PATH"] = env["PATH"].replace("$PATH", "/usr/bin:/bin")
    env |= {"HOME": str(tmp_path), "PYTHONWARNINGS": "ignore", "GIT_PYTHON_REFRESH": "quiet"}
    assert shutil.which("kale", path=env["PATH"]) == argv[0]
    airflow = shutil.which("airflow", path=env["PATH"])
    # What the DAG processor does first: parse every configured bundle into the DB.
    proc = subprocess.run([airflow, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = subprocess.run([sys.executable, "-c", QUERY], env=env, capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    line = next((l for l in out.stdout.splitlines() if l.startswith("KALE_UI")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[len("KALE_UI"):])
    assert set(res["dags"]) == KALE_DAGS, res["dags"]  # no example DAG
    assert not any(res["dags"].values())  # none stale: the DAG processor sees the repository's dags/
    assert res["runs"] == 1
    assert res["kale"] == 200 and "the evening peak is coming" in res["page"]
    assert res["anonymous"] == 401


@pytest.mark.slow
def test_the_printed_command_serves_read_only_and_decides_nothing(airflow_home, tmp_path):
    """Bug class: the UI command resuming the demo's deferred sensors (a triggerer) or starting
    runs (a scheduler), which wrote phantom decisions at the head of the Kale page. The
    printed command runs for real: its processes are the DAG processor and the API server
    only, the API server answers, and the decision log is what the demo left."""
    kale_home = tmp_path / "kale"
    store = StateStore(kale_home / "kale.db")
    store.record_decision(time.time(), 2, {"workers": 3, "reason": "scale_up_forecast", "message": "demo's last"})
    env, argv = parse_printed(airflow_ui_command(airflow_home.path, kale_home))
    env["PATH"] = env["PATH"].replace("$PATH", "/usr/bin:/bin")
    env |= {"HOME": str(tmp_path), "PYTHONWARNINGS": "ignore", "GIT_PYTHON_REFRESH": "quiet"}
    port = _free_port()
    proc = subprocess.Popen([*argv, "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline, healthy = time.monotonic() + 240, False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(1)
        assert healthy, f"the API server did not answer: {proc.poll()}"
        # Once the DAG processor has parsed the Kale DAGs, a triggerer or scheduler would be running too.
        wait_until(lambda: KALE_DAGS <= serialized(airflow_home.path / "airflow.db"),
                   "the DAG processor serialized the Kale DAGs")
        ui = psutil.Process(proc.pid)
        started = [" ".join(c.cmdline()).replace("_", "-") for c in ui.children()]  # api-server retitles itself
        kinds = sorted(k for c in started for k in ("api-server", "dag-processor") if k in c)
        assert len(started) == 2 and kinds == ["api-server", "dag-processor"], started
        everything = " ".join(" ".join(c.cmdline()) for c in ui.children(recursive=True))
        assert not any(word in everything for word in ("scheduler", "triggerer", "standalone")), everything
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "read-only: dag-processor and api-server, no scheduler or triggerer" in out
    assert [d["message"] for d in store.decisions()] == ["demo's last"]  # 0 decisions added
