"""Pod emulation: the worker pods exactly as the kale_training DAG renders them (the real
KubernetesPodOperator, dry run), their container command run as local processes the way a
kubelet would (env values, Secret references and the downward API's pod IP resolved, volume
mounts mapped to local folders), against a real PostgreSQL control plane. Each generation's
pods are the ranks of one torch.distributed job that meet through the control plane (rank 0
publishes its pod IP). A rescale supersedes the generation:
its pods checkpoint and exit 0, report throughput, and the audit log shows that no two
generations ever trained the same slice at the same time, and no sample was skipped."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from kale_airflow.config import load_config
from kale_airflow.control.generations import Generations
from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.operators.worker_pod import WorkerPodOperator, pod_manifest, worker_pods_partial_kwargs
from kale_airflow.runtime.kubernetes import CHECKPOINT_MOUNT, RENDEZVOUS
from kale_airflow.runtime.supervise import free_port
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
PER_PARTITION = 90_000


def kubelet(manifest: dict, secrets: dict, mounts: dict, log, extra_args=()) -> subprocess.Popen:
    """Start a rendered pod's only container as a local process: command and args as rendered
    (``python`` is this interpreter), env from values and secretKeyRefs, mounts mapped."""
    (container,) = manifest["spec"]["containers"]
    env = {"PATH": os.environ["PATH"], "KALE_WORKER_THREADS": "1"}  # three processes share two cores
    for var in container.get("env", []):
        if var["name"] == "KALE_METRICS_PORT":  # every pod has its own network; here they share one host
            env[var["name"]] = "0"
            continue
        if "value" in var:
            env[var["name"]] = mounts.get(var["value"], var["value"])
        elif "fieldRef" in var["valueFrom"]:  # the downward API: this "pod" lives on loopback
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            env[var["name"]] = "127.0.0.1"
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    cmd = [sys.executable if a == "python" else mounts.get(a, a)
           for a in [*container.get("command", []), *container.get("args", [])]]
    return subprocess.Popen([*cmd, *extra_args], env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


def audit_records(path):
    out = []
    for line in open(path):
        p, lo, hi, a, b, generation, t0, t1, *_step_samples_run_rank = line.strip().split(",")
        out.append((Slice(int(p), float(lo), float(hi)), int(a), int(b), generation, float(t0), float(t1)))
    return out


@pytest.fixture
def deployment(tmp_path, postgres_database, monkeypatch):
    stream = EmbeddedStream(tmp_path / "stream.db", partitions=2)
    for p in range(2):
        for chunk in range(PER_PARTITION // 5000):
            stream.append(p, pack(generate(5000, 10 * p + chunk)))
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump({
        "stream_url": f"sqlite:///{tmp_path / 'stream.db'}", "worker_backend": "kubernetes", "max_workers": 4,
        "worker_batch_size": 256, "worker_step_time_s": 0.05, "handover_timeout_s": 30}))
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_CONFIG", str(tmp_path / "kale.yaml"))
    monkeypatch.setenv("KALE_DATABASE_URL", postgres_database)
    return tmp_path, stream, postgres_database


def test_rendered_pods_obey_generations_report_and_never_overlap(deployment):
    tmp, stream, db = deployment
    cfg = load_config()
    generations, store = Generations(cfg), StateStore(db)
    secrets = {cfg.deployment.kubernetes.database_secret: {cfg.deployment.kubernetes.database_secret_key: db}}
    audit, log = tmp / "audit.log", open(tmp / "pods.log", "ab")

    started: list[subprocess.Popen] = []  # ended by PID if the test fails half-way

    def start(generation):
        # The pods rendezvous through the control plane at rank 0's pod IP and RENDEZVOUS_PORT;
        # here every "pod" shares loopback, so the port is mapped to a free one.
        mounts = {CHECKPOINT_MOUNT: str(tmp / "ck"), RENDEZVOUS: f"control-plane:{free_port()}"}
        pods = []
        for i, args in enumerate(generations.pod_arguments(generation)):
            op = WorkerPodOperator(**{**worker_pods_partial_kwargs(cfg.deployment), "task_id": f"worker_{i}"},
                                   arguments=args)
            manifest = pod_manifest(op)
            assert db not in str(manifest)  # the URL (and its credentials) only through the Secret
            assert RENDEZVOUS in manifest["spec"]["containers"][0]["args"]
            pods.append(kubelet(manifest, secrets, mounts, log, ["--audit", str(audit)]))
        return pods

    try:
        g1 = generations.apply({"status": "scale", "current": 0, "workers": 2, "reason": "scale_up_forecast",
                                "message": "start"}, run_id="run1")["generation"]
        generations.rebalance(g1, 2)
        first = start(g1)
        metrics = EmbeddedMetrics(db)
        wait_for(lambda: (metrics.throughput_observations()["workers"] == 2).any(), 180, "generation 1's throughput")

        g2 = generations.apply({"status": "scale", "current": 2, "workers": 3, "reason": "scale_up_forecast",
                                "message": "more"}, run_id="run2")["generation"]
        superseded = time.monotonic()
        generations.rebalance(g2, 3)  # waits until generation 1 has checkpointed and stopped
        assert [p.wait(timeout=30) for p in first] == [0, 0]
        assert time.monotonic() - superseded < 30
        assert {w: r["state"] for w, r in store.workers_seen(g1).items()} == {0: "stopped", 1: "stopped"}
        second = start(g2)

        doc = generations.assignment(g2)
        slices = [sl for w in range(3) for sl in slices_for(doc, w)]

        def drained():  # every slice of generation 2 has read to the end of its partition (commits follow
            reached = {}  # the next checkpoint, which the stop below writes)
            for sl, a, b, g, *_ in audit_records(audit):
                if g == g2:
                    reached[sl.group_suffix] = max(reached.get(sl.group_suffix, 0), b)  # 6-decimal bounds
            return all(reached.get(sl.group_suffix, 0) == PER_PARTITION for sl in slices)

        wait_for(lambda: (metrics.throughput_observations()["workers"] == 3).any(), 180, "generation 2's throughput")
        wait_for(drained, 120, "generation 2 to train the rest of the stream")
        store.set_current_generation("done", 0)
        assert [p.wait(timeout=30) for p in second] == [0, 0, 0]
        assert all(stream.committed(f"{cfg.deployment.group}/{sl.group_suffix}", sl.partition) == PER_PARTITION
                   for sl in slices)  # the final checkpoint's positions, committed after it

        records = audit_records(audit)
        for p in range(2):  # no sample skipped
            trained = set()
            for s, a, b, *_ in records:
                if s.partition == p:
                    offs = np.arange(a, b)
                    trained |= set(offs[s.mask(offs)].tolist())
            assert trained == set(range(PER_PARTITION)), f"partition {p}: {PER_PARTITION - len(trained)} never trained"
        last_g1 = max(t1 for *_, g, t0, t1 in records if g == g1)
        first_g2 = min(t0 for *_, g, t0, t1 in records if g == g2)
        assert last_g1 <= first_g2  # generation 2 trained nothing until generation 1 had stopped
    finally:
        for pod in started:
            if pod.poll() is None:
                pod.kill()
