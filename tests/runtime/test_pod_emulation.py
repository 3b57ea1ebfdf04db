"""Pod emulation: the worker pods exactly as the kale_training DAG renders them (the real
KubernetesPodOperator, dry run), their container command run as local processes the way a
kubelet would (env values, Secret references and the downward API's pod IP resolved, volume
mounts mapped to local folders), against a real PostgreSQL control plane. The ranks meet
through the control plane (slot 0 publishes its pod IP for every generation) and stay warm
across generations: a 2 -> 3 -> 2 sequence starts only the added slot's pod, the scale-down
ends only the removed slot's pod (exit 0), the other pods re-join in place with the model in
memory; the audit shows that no two generations ever trained at the same time and that no
sample was skipped."""

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


def test_warm_pods_rejoin_in_place_through_2_3_2_and_never_overlap(deployment):
    tmp, stream, db = deployment
    cfg = load_config()
    generations, store = Generations(cfg), StateStore(db)
    secrets = {cfg.deployment.kubernetes.database_secret: {cfg.deployment.kubernetes.database_secret_key: db}}
    audit, log = tmp / "audit.log", open(tmp / "pods.log", "ab")
    metrics = EmbeddedMetrics(db)
    pods: dict[int, subprocess.Popen] = {}  # by slot; ended by PID if the test fails half-way

    def rescale(n, run):
        cur = store.current()
        g = generations.apply({"status": "scale", "current": cur["workers"] if cur else 0, "workers": n,
                               "current_generation": cur["generation"] if cur else None,
                               "reason": "scale_up_forecast", "message": "t"}, run_id=run)["generation"]
        generations.rebalance(g, n)  # waits until the previous generation has checkpointed and stopped
        started = []
        # The pods rendezvous through the control plane at slot 0's pod IP and RENDEZVOUS_PORT;
        # here every "pod" shares loopback, so the port is mapped to a free one.
        for i, args in enumerate(generations.pod_arguments(g, run_id=f"train-{run}")):
            op = WorkerPodOperator(**{**worker_pods_partial_kwargs(cfg.deployment), "task_id": f"worker_{i}"},
                                   arguments=args)
            manifest = pod_manifest(op)
            assert db not in str(manifest)  # the URL (and its credentials) only through the Secret
            assert RENDEZVOUS in manifest["spec"]["containers"][0]["args"]
            slot = int(args[args.index("--worker-id") + 1])
            mounts = {CHECKPOINT_MOUNT: str(tmp / "ck"), RENDEZVOUS: f"control-plane:{free_port()}"}
            pods[slot] = kubelet(manifest, secrets, mounts, log, ["--audit", str(audit)])
            started.append(slot)
        return g, started

    def trained(g):
        return lambda: store.get_value(f"rescale/{g}") is not None

    try:
        g1, first = rescale(2, "run1")
        assert first == [0, 1]
        wait_for(lambda: (metrics.throughput_observations()["workers"] == 2).any(), 180, "generation 1's throughput")
        kept = {s: pods[s].pid for s in first}

        g2, added = rescale(3, "run2")
        assert added == [2]  # only the added slot's pod: the others re-join in place
        assert {w: r["state"] for w, r in store.workers_seen(g1).items()} == {0: "warm", 1: "warm"}
        wait_for(trained(g2), 180, "generation 2's first step")
        rec = store.get_value(f"rescale/{g2}")
        assert rec["kind"] == "warm" and (rec["from_world"], rec["to_world"]) == (2, 3)
        assert all(pods[s].poll() is None and pods[s].pid == pid for s, pid in kept.items())

        g3, none = rescale(2, "run3")
        assert none == []  # a scale-down starts no pod
        assert pods[2].wait(timeout=60) == 0  # only the removed slot's pod ends, successfully
        wait_for(trained(g3), 120, "generation 3's first step")
        assert store.get_value(f"rescale/{g3}")["kind"] == "warm" and pods[0].poll() is None and pods[1].poll() is None
        assert store.workers_seen(g2)[2]["state"] == "stopped"

        doc = generations.assignment(g3)
        slices = [sl for w in range(2) for sl in slices_for(doc, w)]

        def drained():  # every slice of generation 3 has read to the end of its partition (commits follow
            reached = {}  # the next checkpoint, which the stop below writes)
            for sl, a, b, g, *_ in audit_records(audit):
                if g == g3:
                    reached[sl.group_suffix] = max(reached.get(sl.group_suffix, 0), b)  # 6-decimal bounds
            return all(reached.get(sl.group_suffix, 0) == PER_PARTITION for sl in slices)

        wait_for(drained, 180, "generation 3 to train the rest of the stream")
        store.set_current_generation("done", 0)
        assert [pods[s].wait(timeout=60) for s in (0, 1)] == [0, 0]
        assert all(stream.committed(f"{cfg.deployment.group}/{sl.group_suffix}", sl.partition) == PER_PARTITION
                   for sl in slices)  # the final checkpoint's positions, committed after it

        records = audit_records(audit)
        for p in range(2):  # no sample skipped
            seen = set()
            for s, a, b, *_ in records:
                if s.partition == p:
                    offs = np.arange(a, b)
                    seen |= set(offs[s.mask(offs)].tolist())
            assert seen == set(range(PER_PARTITION)), f"partition {p}: {PER_PARTITION - len(seen)} never trained"
        for old, new in ((g1, g2), (g2, g3)):  # a generation trained nothing until the one before had stopped
            assert max(t1 for *_, g, t0, t1 in records if g == old) <= min(t0 for *_, g, t0, t1 in records if g == new)
    finally:
        for pod in pods.values():
            if pod.poll() is None:
                pod.kill()
