"""Warm ranks on Kubernetes, rendered without a cluster: a 2 -> 3 -> 2 sequence of generations
through the kale_training DAG's mapped pod task. The first generation renders a pod per slot;
the scale-up renders only the added slot's pod (the others' ranks report ``warm`` and re-join
in place); the scale-down renders none, and only the removed slot's rank leaves (its pod ends,
exit 0). Every rendered pod validates strictly, as the DAG's pods always do."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kale_airflow.runtime.elastic import JOIN, LEAVE, next_action

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "kale_training.py"


@pytest.fixture
def k8s(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from kale_airflow.stream.embedded import EmbeddedStream

    stream = EmbeddedStream(tmp_path / "stream.db", partitions=4)
    for p in range(4):
        stream.append(p, [b"x"] * 10)
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump({
        "stream_url": f"sqlite:///{tmp_path / 'stream.db'}", "worker_backend": "kubernetes", "max_workers": 4,
        "partitions": 4, "handover_timeout_s": 5}))
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_CONFIG", str(tmp_path / "kale.yaml"))
    monkeypatch.setenv("KALE_DATABASE_URL", f"sqlite:///{tmp_path / 'kale.db'}")
    bag = DagBag(dag_folder=str(DAG_FILE), safe_mode=False)
    assert bag.import_errors == {}
    return bag.dags["kale_training"]


def rescale(gens, workers: int, run: str) -> tuple[str, list[list[str]]]:
    """What the autoscaler and one kale_training run do: apply, rebalance, the pods' arguments."""
    cur = gens.store.current()
    done = gens.apply({"status": "scale", "current": cur["workers"] if cur else 0, "workers": workers,
                       "current_generation": cur["generation"] if cur else None, "reason": "t", "message": "t"},
                      run_id=f"auto-{run}")
    gens.rebalance(done["generation"], workers)
    return done["generation"], gens.pod_arguments(done["generation"], run_id=run)


def slots(args: list[list[str]]) -> list[int]:
    return [int(a[a.index("--worker-id") + 1]) for a in args]


def test_a_2_3_2_sequence_creates_only_the_added_pod_and_ends_only_the_removed_one(k8s):
    from kale_airflow.config import load_config
    from kale_airflow.control.generations import Generations
    from kale_airflow.operators.worker_pod import pod_manifest

    gens = Generations(load_config())
    assert k8s.max_active_runs >= 4 + 1  # runs that own living pods, plus the newest
    g1, pods = rescale(gens, 2, "run1")
    assert slots(pods) == [0, 1]
    for args in pods:
        assert "--warm-wait" in args and args[args.index("--generation") + 1] == g1
        manifest = pod_manifest(k8s.get_task("worker_pods").unmap({"arguments": args}))
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    for slot in (0, 1):  # g1's ranks train, then stop for g2 and wait warm
        gens.store.worker_seen(g1, slot, "warm")

    g2, pods = rescale(gens, 3, "run2")
    assert slots(pods) == [2]  # only the added slot: slots 0 and 1 re-join in place
    manifest = pod_manifest(k8s.get_task("worker_pods").unmap({"arguments": pods[0]}))
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    assert manifest["spec"]["containers"][0]["args"][1:] == pods[0][1:]
    current = gens.store.current()
    assert [next_action(s, g1, current) for s in (0, 1)] == [JOIN, JOIN]
    for slot in (0, 1, 2):
        gens.store.worker_seen(g2, slot, "warm")

    g3, pods = rescale(gens, 2, "run3")
    assert pods == []  # a scale-down starts nothing: the mapped task has nothing to map
    current = gens.store.current()
    assert [next_action(s, g2, current) for s in (0, 1, 2)] == [JOIN, JOIN, LEAVE]  # slot 2's pod exits 0

    # Without warm ranks every generation is a new job: every slot gets a pod, as before.
    cold = gens.config.deployment.model_copy(update={"worker_warm_wait_s": 0.0})
    gens.config = type(gens.config)(gens.config.settings, cold)
    _, pods = rescale(gens, 3, "run4")
    assert slots(pods) == [0, 1, 2] and all("--warm-wait" not in a for a in pods)
