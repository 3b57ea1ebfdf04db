"""The values kale-airflow's NOTES print for the official apache-airflow chart (the ConfigMap
``kale-airflow-values``): they pin the Airflow version and image, hand every Airflow component
the Kale configuration and Secrets, and the scheduler's init container creates the GPU pool
with a command that works against a real Airflow database.

The official chart itself is not rendered here: no registry this project's CI reaches carries
it (it is published on airflow.apache.org's Helm repository), so docs/testing.md lists that
check among what is not exercised."""

import json
import os
import subprocess
import sys
from pathlib import Path

import helm_python
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KALE_CHART = ROOT / "charts" / "kale-airflow"
VALUES = {"database": {"existingSecret": "kale-db"}, "mlflow": {"enabled": True}}


def kale_overlay(values: dict = VALUES) -> dict:
    """The official chart's values from kale-airflow's ConfigMap (the file NOTES tells to pass with -f)."""
    rendered = helm_python.Chart.load(str(KALE_CHART)).render(values, name="kale", namespace="airflow")
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kale-airflow-values")
    return yaml.safe_load(cm["data"]["values.yaml"])


def pool_container(overlay: dict) -> dict:
    return next(c for c in overlay["scheduler"]["extraInitContainers"] if c["name"] == "kale-pool")


def test_the_overlay_pins_the_airflow_version_and_image():
    overlay = kale_overlay()
    assert overlay["airflowVersion"] and overlay["defaultAirflowTag"] and overlay["defaultAirflowTag"] != "latest"
    assert overlay["defaultAirflowRepository"]


@pytest.mark.slow
def test_the_pool_command_works_against_an_airflow_database(tmp_path):
    """The init container's command, as the overlay gives it, run by this venv's Airflow (the
    version the Airflow image pins) against a migrated database, twice (every scheduler start)."""
    pool = pool_container(kale_overlay())
    airflow = str(Path(sys.executable).parent / "airflow")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}"}
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    for _ in range(2):
        done = subprocess.run([airflow, *pool["args"][1:]], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    got = subprocess.run([airflow, "pools", "get", "kale_gpu", "-o", "json"], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    (row,) = json.loads(got.stdout[got.stdout.index("["):])
    assert (row["pool"], row["slots"], row["include_deferred"]) == ("kale_gpu", "64", "True")
