"""A generation whose worker pods exhaust their retries alerts, naming the generation and the
worker: kale_training run for real with dag.test() against a Kubernetes API that is not there,
so every pod try fails and Airflow walks the mapped pod tasks through all their retries."""

import json
from pathlib import Path

import pytest
import yaml
from airflow.sdk import BaseNotifier

from kale_airflow.stream.embedded import EmbeddedStream
from tests.airflow_harness import ROOT

pytestmark = pytest.mark.slow


class FileNotifier(BaseNotifier):
    """Appends each alert to a JSON-lines file (the DAG runs in another process)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def notify(self, context):
        with open(self.path, "a") as fh:
            fh.write(json.dumps(context["kale_alert"]) + "\n")


def test_worker_pods_out_of_retries_alert_once_each_naming_the_generation(airflow_home, tmp_path):
    home, sent = airflow_home.kale_home, tmp_path / "alerts.jsonl"
    home.mkdir(parents=True, exist_ok=True)
    EmbeddedStream(home / "stream.db", partitions=2)
    (home / "kale.yaml").write_text(yaml.safe_dump({
        "worker_backend": "kubernetes", "max_workers": 4,
        "kubernetes": {"pool": "default_pool", "deferrable": False},
        "alerts": {"notifier": f"{__name__}.FileNotifier", "notifier_kwargs": {"path": str(sent)}}}))
    run = airflow_home.run("kale_training", {"workers": 2, "generation": "g-pods-down"}, extra_env={
        "PYTHONPATH": str(ROOT), "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""}, retries=1)  # 1 retry, not 3: 60 s less waiting
    assert run.state == "failed" and run.tasks["worker_pods"] == "failed", run.log[-3000:]
    alerts = [json.loads(line) for line in Path(sent).read_text().splitlines()] if sent.exists() else []
    # One alert per pod task, after its 2nd and last try (1 retry here): none while retries remained.
    assert sorted(a["title"] for a in alerts) == [f"kale_training.worker_pods[{i}] of generation g-pods-down failed"
                                                  for i in (0, 1)], run.log[-3000:]
    assert all(a["kind"] == "task_failed" and "try 2" in a["message"] for a in alerts)
