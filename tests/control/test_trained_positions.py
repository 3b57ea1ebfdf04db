"""The backlog and the freshness lag from what the ranks trained, not only what they
committed: commits follow checkpoints, so alone they count samples the model already has."""

import threading
import time

import numpy as np
import pytest

from kale_airflow.control.autoscaler import stream_backlog
from kale_airflow.core.rebalance import assign
from kale_airflow.core.slices import slices_for
from kale_airflow.runtime.control_plane import ControlPlane
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.control.test_autoscaler import NOW, autoscaler, home, running  # noqa: F401 - the fixture

RATE = 400.0  # samples/s of the job's traffic, over 4 partitions


def test_a_job_that_keeps_up_reports_a_backlog_under_two_seconds_of_its_traffic(home, tmp_path):
    """Bug: the backlog was read from the commits alone. At the production checkpoint
    interval (60 s) a job that kept up reported up to a minute of its traffic as backlog,
    and the planner provisioned for samples already trained on. A real rank trains the
    live stream here; its ``running`` heartbeats say how far."""
    auto = autoscaler(home)
    assert auto.dep.worker_checkpoint_every_s == 60  # the production default
    stream = home[1]
    running(auto, 1, "g1")
    assignment = auto.state.current()["assignment"]
    worker = Worker(stream, auto.dep.group, slices_for({"assignment": assignment}, 0), tmp_path / "ck",
                    generation="g1", batch_size=64, checkpoint_every=10**6, checkpoint_every_s=60.0,
                    control=ControlPlane.of(auto.state))
    stop = threading.Event()

    def produce():
        k = 0
        while not stop.is_set():
            for p in range(4):
                stream.append(p, pack(generate(int(RATE / 40), seed=k * 4 + p)))
            k += 1
            time.sleep(0.1)

    threads = [threading.Thread(target=produce), threading.Thread(target=worker.run, kwargs={"idle_sleep": 0.05})]
    for t in threads:
        t.start()
    try:
        time.sleep(8.0)  # 8 s of traffic, no checkpoint yet: nothing committed
        now = time.time()
        obs = auto.observe(now, record=False)
        by_commits = stream_backlog(stream, auto.dep.group, assignment, now)
    finally:
        stop.set()
        auto.state.set_current_generation("g2", 1)  # superseded: the rank checkpoints and stops
        for t in threads:
            t.join(60)
    assert by_commits[0] > 6 * RATE  # what the commits alone say: the whole run
    assert obs.backlog < 2 * RATE, obs
    assert obs.freshness_lag_s < 2.0, obs


def slices_of(workers: int = 3):
    doc = assign({str(p): 1.0 / (p + 1) for p in range(4)}, workers).to_dict()
    return doc["assignment"], [sl for w in doc["assignment"] for sl in slices_for(doc, int(w))]


def test_each_slice_is_measured_from_the_furthest_of_its_commit_and_its_trained_position(tmp_path):
    """Ahead of the commit, the trained position counts; behind it (a rank that restarted
    from an earlier checkpoint and replays), the commit does; a slice nobody reported, its
    commit; the oldest pending sample is the one at the position used."""
    stream = EmbeddedStream(tmp_path / "s.db", partitions=4)
    for p in range(4):
        for k in range(10):
            stream.append(p, [b"x"] * 10, ts=NOW - 100 + 10 * k)  # record i of 100 appended at NOW - 100 + i // 10 * 10
    assignment, slices = slices_of()
    commits = {sl: int(np.random.default_rng(i).integers(0, 60)) for i, sl in enumerate(slices)}
    for sl, pos in commits.items():
        stream.commit(f"kale/{sl.group_suffix}", {sl.partition: pos})
    ahead, behind, silent = slices[0], slices[1], slices[2]
    trained = {ahead.group_suffix: commits[ahead] + 30, behind.group_suffix: max(commits[behind] - 5, 0)}
    used = {sl: max(commits[sl], trained.get(sl.group_suffix, 0)) for sl in slices}
    assert used[ahead] > commits[ahead] and used[behind] == commits[behind] and used[silent] == commits[silent]
    backlog, age = stream_backlog(stream, "kale", assignment, NOW, trained=trained)
    assert backlog == pytest.approx(sum((100 - pos) * (sl.hi - sl.lo) for sl, pos in used.items()), rel=1e-12)
    assert age == pytest.approx(100 - 10 * (min(used.values()) // 10))
    assert stream_backlog(stream, "kale", assignment, NOW)[0] > backlog  # the commits alone count more


def test_only_fresh_running_ranks_of_the_generation_are_trusted(db_url):
    """A rank that stopped (its final checkpoint committed), one silent for longer than the
    window (it may have crashed: its slices replay from the commit) and another generation's
    ranks say nothing about where the generation's samples stand."""
    store = StateStore(db_url)
    store.worker_seen("g1", 0, "running", now=NOW - 1, positions={"p0:0.000000-1.000000": 50})
    store.worker_seen("g1", 1, "running", now=NOW - 90, positions={"p1:0.000000-1.000000": 70})
    store.worker_seen("g1", 2, "stopped", now=NOW - 1)
    store.worker_seen("g0", 0, "running", now=NOW - 1, positions={"p2:0.000000-1.000000": 80})
    store.worker_seen("g1", 3, "running", now=NOW - 2)  # before its first step: no positions yet
    assert store.trained_positions("g1", since=NOW - 60) == {"p0:0.000000-1.000000": 50}
    assert store.trained_positions("g1", since=NOW - 120) == {"p0:0.000000-1.000000": 50,
                                                              "p1:0.000000-1.000000": 70}
