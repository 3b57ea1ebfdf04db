"""A rank process's generations (:class:`~kale_airflow.runtime.worker.Job`) in process: which
generation a waiting rank joins, when it leaves, the heartbeat it leaves behind, and one warm
process through three generations of one rank. The multi-process runs: test_warm_rescale.py."""

import threading
import time

import pytest

from kale_airflow.runtime import worker as worker_module
from kale_airflow.runtime.control_plane import ControlPlane
from kale_airflow.runtime.elastic import HANDOVER_KEY
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.supervise import free_port
from kale_airflow.runtime.worker import Job, build_arg_parser
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import wait_until

ONE_SLICE = {"0": [["0", 1.0]]}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A stream with data, the control store (written to at once: no writer thread) and a
    factory of rank processes on them."""
    monkeypatch.setattr(worker_module, "_signalled", [])
    stream = EmbeddedStream(tmp_path / "s.db", partitions=1)
    for chunk in range(3):
        stream.append(0, pack(generate(500, chunk)))
    store = StateStore(tmp_path / "kale.db")

    def job(*extra: str, slot: int = 0) -> Job:
        args = build_arg_parser().parse_args([
            "--stream", f"sqlite:///{tmp_path / 's.db'}", "--worker-id", str(slot), "--checkpoint-dir",
            str(tmp_path / "ck"), "--batch-size", "50", "--checkpoint-every", "2", "--device", "cpu",
            "--report-every", "0", "--generation-poll", "0.01", *extra])
        return Job(args, ControlPlane.of(store, background=False))

    return store, job


def warm(job, slot: int = 0, wait_s: float = 5.0) -> Job:
    return job("--warm-wait", str(wait_s), "--rendezvous", f"127.0.0.1:{free_port()}", slot=slot)


def name(store: StateStore, generation: str, workers: int, assignment: dict | None = ONE_SLICE) -> None:
    """What the autoscaler (the generation and its size) and the rebalance (its assignment) write."""
    store.set_current_generation(generation, workers)
    if assignment is not None:
        assert store.put("default", generation, workers, {"assignment": assignment})


def state_of(store: StateStore, generation: str, slot: int = 0) -> str | None:
    return (store.workers_seen(generation).get(slot) or {}).get("state")


def serve_with(rank: Job, airflow) -> None:
    """The rank serves its generations while ``airflow`` (run in a thread) names them; it exits 0."""
    driver = threading.Thread(target=airflow)
    driver.start()
    assert rank.serve() == 0
    driver.join()


def then_stop(store: StateStore, generation: str) -> None:
    """Once ``generation`` trains, name a generation of no workers: every rank leaves."""
    wait_until(lambda: state_of(store, generation) == "running", f"{generation} training", 10)
    name(store, "g-stop", 0, assignment=None)


def test_a_new_rank_joins_the_named_generation_once_it_is_assigned_and_says_ready_before(world):
    store, job = world
    name(store, "g1", 1, assignment=None)  # decided, not yet rebalanced
    rank = warm(job)
    threading.Timer(0.3, lambda: store.put("default", "g1", 1, {"assignment": ONE_SLICE})).start()
    t0 = time.monotonic()
    assert rank.await_target(after=None) == ("g1", {"assignment": ONE_SLICE})
    assert time.monotonic() - t0 >= 0.25  # it waited for the assignment
    assert state_of(store, "g1") == "ready"  # the old generation's ranks train on until then


def test_a_rank_never_rejoins_the_generation_it_trained_and_beats_warm_while_it_waits(world, monkeypatch):
    store, job = world
    monkeypatch.setattr(worker_module, "WARM_BEAT_S", 0.05)
    name(store, "g1", 1)
    rank = warm(job, wait_s=0.4)
    t0 = time.monotonic()
    assert rank.await_target(after="g1") is None  # g1 is the one it trained: it waits out --warm-wait
    assert 0.4 <= time.monotonic() - t0 < 3
    seen = store.workers_seen("g1")[0]
    assert seen["state"] == "stopped"  # it left, and says so for the next generation's pods
    assert state_of(store, "g1") != "ready"


def test_a_waiting_rank_beats_warm_for_the_generation_it_trained(world, monkeypatch):
    store, job = world
    monkeypatch.setattr(worker_module, "WARM_BEAT_S", 0.05)
    name(store, "g1", 1)
    rank = warm(job, wait_s=5)
    beats = []
    threading.Timer(0.3, lambda: (beats.append(state_of(store, "g1")), name(store, "g2", 1))).start()
    assert rank.await_target(after="g1") == ("g2", {"assignment": ONE_SLICE})
    assert beats == ["warm"]
    assert state_of(store, "g2") is None  # a rank that trained before says ready only as a new one


def test_a_slot_the_next_generation_has_no_room_for_leaves_at_once_saying_stopped(world):
    store, job = world
    name(store, "g2", 1)
    rank = warm(job, slot=1, wait_s=5)
    t0 = time.monotonic()
    assert rank.await_target(after="g1") is None
    assert time.monotonic() - t0 < 4  # at once, not at the end of --warm-wait
    assert state_of(store, "g1", slot=1) == "stopped"
    assert state_of(store, "g2", slot=1) is None


def test_a_new_rank_left_out_of_the_named_generation_leaves_without_a_heartbeat(world):
    store, job = world
    name(store, "g1", 2, assignment={"0": [["0", 1.0]], "1": []})
    rank = warm(job, slot=2, wait_s=5)
    assert rank.await_target(after=None) is None
    assert store.workers_seen("g1") == {}


def test_a_signal_ends_the_wait(world, monkeypatch):
    _, job = world
    rank = warm(job, wait_s=5)
    monkeypatch.setattr(worker_module, "_signalled", [15])
    t0 = time.monotonic()
    assert rank.await_target(after=None) is None
    assert time.monotonic() - t0 < 4


@pytest.mark.parametrize("reason, current, slot, expect", [
    ("stopped", ("g2", 1), 0, "warm"),       # a newer generation with room: wait for it
    ("stopped", ("g1", 1), 0, "stopped"),    # still the current one (stopped by hand): leave
    ("stopped", ("g2", 1), 1, "stopped"),    # the newer one has no room for this slot
    ("max_steps", ("g2", 1), 0, "stopped"),  # stopped for another reason than a newer generation
])
def test_the_last_heartbeat_of_a_generation_says_whether_this_rank_waits(world, reason, current, slot, expect):
    store, job = world
    name(store, *current)
    rank = warm(job, slot=slot)
    assert rank.final_state({"reason": reason, "generation": "g1"}) == expect
    assert rank.next == (worker_module.WAIT if expect == "warm" else worker_module.LEAVE)


def test_a_rank_a_scale_down_removes_stays_warm_as_a_spare(world):
    store, job = world
    name(store, "g2", 1)  # slot 1 trained g1; g2 has one worker, the pool keeps one spare
    rank = job("--warm-wait", "5", "--standby", "1", "--rendezvous", f"127.0.0.1:{free_port()}", slot=1)
    assert rank.final_state({"reason": "stopped", "generation": "g1"}) == "warm"
    assert rank.next == worker_module.WAIT


def test_a_rank_of_one_generation_never_waits(world):
    store, job = world
    name(store, "g2", 1)
    rank = job("--assignment", '{"0": [["0", 1.0]]}')
    assert rank.final_state({"reason": "stopped", "generation": "g1"}) == "stopped"
    assert rank.next == worker_module.LEAVE


def test_the_decision_time_is_the_named_generations_only(world):
    store, job = world
    rank = job("--assignment", '{"0": [["0", 1.0]]}')
    assert rank._decided("g1") is None  # nothing named
    before = time.time()
    store.set_current_generation("g1", 1)
    assert before <= rank._decided("g1") <= time.time()
    assert rank._decided("g0") is None  # an older generation's rank
    rank.link = None
    assert rank._decided("g1") is None


def test_a_rank_of_one_generation_trains_its_assignment_then_exits(world, tmp_path):
    store, job = world
    store.set_current_generation("7", 1)
    rank = job("--assignment", '{"0": [["0", 1.0]]}', "--generation", "7", "--max-steps", "4")
    assert rank.serve() == 0
    assert rank.generation == "7" and state_of(store, "7") == "stopped"
    assert (tmp_path / "ck" / "model.pt").exists()


def test_a_superseded_generation_trains_on_until_the_next_ones_rebalance_begins(world):
    """Bug: the running generation stopped as soon as the next one was named, and nothing
    trained until Airflow ran the new generation's rebalance (19 s of every rescale of make
    demo). A stop (a generation of no workers) still stops it at once."""
    store, job = world
    name(store, "g1", 1)
    store.set_value(HANDOVER_KEY, {"generation": "g1", "since": time.time()})  # what g1's rebalance wrote
    rank = warm(job)
    seen = {}

    def airflow():
        wait_until(lambda: state_of(store, "g1") == "running", "g1 training", 10)
        name(store, "g2", 1)
        time.sleep(0.5)  # fifty polls of rank 0
        seen["named"] = state_of(store, "g1")
        store.set_value(HANDOVER_KEY, {"generation": "g2", "since": time.time()})  # g2's rebalance begins
        wait_until(lambda: state_of(store, "g2") == "running", "g2 training", 10)
        seen["handed over"] = state_of(store, "g1")
        name(store, "g3", 0, assignment=None)

    driver = threading.Thread(target=airflow)
    driver.start()
    assert rank.serve() == 0
    driver.join()
    assert seen == {"named": "running", "handed over": "warm"}
    assert state_of(store, "g2") == "stopped"  # g3 has no workers: no rebalance, at once


def test_a_ranks_metrics_carry_its_job(world):
    """Bug: every rank's series labelled as the default job, so the Prometheus source of one
    job of a fleet averaged in the other jobs' workers."""
    from kale_airflow.runtime import exposition

    store, job = world
    store.set_current_generation("7", 1)
    rank = job("--assignment", '{"0": [["0", 1.0]]}', "--generation", "7", "--max-steps", "1", "--job", "ads")
    assert rank.serve() == 0
    assert exposition.METRICS.labels == {"kale_job": "ads", "worker": "0", "generation": "7", "workers": "1"}


def test_more_than_one_rank_needs_a_rendezvous(world):
    _, job = world
    rank = job("--assignment", '{"0": [["0", 1.0]], "1": [["0", 1.0]]}', "--max-steps", "1")
    with pytest.raises(SystemExit, match="needs --rendezvous"):
        rank.serve()


def test_the_world_is_the_assignments_size_unless_given(world):
    _, job = world
    rank = job("--assignment", "{}", "--workers-total", "3")
    with pytest.raises(SystemExit, match="needs --rendezvous"):  # 3 ranks, not the assignment's 0
        rank.train("g1", {"assignment": {}})


def test_one_warm_process_trains_generation_after_generation_until_its_slot_is_left_out(world):
    """g1 trains; g2 supersedes it: the process stays and continues the model in g2 (its
    step counter goes on); g3 has no room for slot 0: the process ends with exit code 0."""
    store, job = world
    name(store, "g1", 1)
    rank = warm(job)
    steps = {}

    def later():
        for gen, workers in (("g2", 1), ("g3", 0)):
            deadline = time.monotonic() + 10
            while state_of(store, rank.generation or "-") != "running" and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # a few steps
            steps[rank.generation] = True
            name(store, gen, workers, assignment=ONE_SLICE if workers else None)

    driver = threading.Thread(target=later)
    driver.start()
    assert rank.serve() == 0
    driver.join()
    assert list(steps) == ["g1", "g2"] and rank.generation == "g2"
    assert state_of(store, "g1") == "warm" and state_of(store, "g2") == "stopped"
    kinds = [store.get_value(f"rescale/{g}") for g in ("g1", "g2")]
    assert kinds[1] is not None and kinds[1]["kind"] == worker_module.WARM


def test_a_warm_generation_change_records_its_pause_from_the_decision(world):
    """The pause the planner prices: from the decision naming g2 to g2's first step (and the
    gap from g1's last step), with the state from memory."""
    store, job = world
    name(store, "g1", 1)
    rank = warm(job)
    decided = []

    def later():
        wait_until(lambda: state_of(store, "g1") == "running", "g1 training", 10)
        name(store, "g2", 1)
        decided.append(store.get_value("generation_meta")["since"])
        store.set_value(HANDOVER_KEY, {"generation": "g2", "since": time.time()})
        wait_until(lambda: store.get_value("rescale/g2") is not None, "g2's pause recorded", 10)
        name(store, "g3", 0, assignment=None)

    serve_with(rank, later)
    rec = store.get_value("rescale/g2")
    assert (rec["kind"], rec["from_world"], rec["to_world"], rec["source_rank"]) == ("warm", 1, 1, 0)
    assert rec["decided"] == decided[0] and rec["pause_s"] == round(rec["first_step"] - decided[0], 3)
    assert 0 <= rec["pause_s"] < 10 and 0 <= rec["gap_s"] < 10


def test_a_meeting_a_newer_generation_overtakes_is_given_up_for_that_one(world):
    """g1 names two ranks and only slot 0 comes; g2 (one rank) is named meanwhile: slot 0
    gives up g1's meeting, trains g2, and says nothing for g2 before it joins it."""
    store, job = world
    name(store, "g1", 2, assignment={"0": [["0", 1.0]], "1": []})
    rank = warm(job)

    def later():
        time.sleep(0.5)  # slot 0 waits at g1's meeting
        name(store, "g2", 1)
        then_stop(store, "g2")

    serve_with(rank, later)
    assert rank.generation == "g2" and state_of(store, "g2") == "stopped"


def test_a_meeting_nobody_else_comes_to_times_out_after_the_warm_wait(world):
    store, job = world
    name(store, "g1", 2, assignment={"0": [["0", 1.0]], "1": []})
    with pytest.raises(worker_module.RendezvousTimeout,
                       match=r"^the 2 rank\(s\) of generation g1 did not all meet within 0.5 s$"):
        warm(job, wait_s=0.5).serve()


def test_a_warm_rank_never_named_exits_0_when_its_wait_runs_out(world):
    _, job = world
    assert warm(job, wait_s=0.2).serve() == 0


def test_a_surviving_rank_waits_for_the_next_assignment_without_saying_ready(world, monkeypatch):
    """Between g1's stop and g2's assignment the surviving rank beats warm for g1; ready is
    what a new rank says, and the old generation's stop waits on the added ranks' ready."""
    store, job = world
    monkeypatch.setattr(worker_module, "WARM_BEAT_S", 0.05)
    name(store, "g1", 1)
    rank = warm(job)
    seen = {}

    def later():
        wait_until(lambda: state_of(store, "g1") == "running", "g1 training", 10)
        name(store, "g2", 1, assignment=None)  # decided; its rebalance begins, the assignment comes later
        store.set_value(HANDOVER_KEY, {"generation": "g2", "since": time.time()})
        wait_until(lambda: state_of(store, "g1") == "warm", "g1 stopped for g2", 10)
        first = store.workers_seen("g1")[0]["heartbeat"]
        time.sleep(0.3)
        seen["g2 before"] = state_of(store, "g2")
        seen["g1 beats on"] = store.workers_seen("g1")[0]["heartbeat"] > first
        assert store.put("default", "g2", 1, {"assignment": ONE_SLICE})
        then_stop(store, "g2")

    serve_with(rank, later)
    assert seen == {"g2 before": None, "g1 beats on": True} and rank.generation == "g2"


def test_a_waiting_rank_says_ready_once_and_beats_warm_every_warm_beat_only(world, monkeypatch):
    """Heartbeats are database writes: one ready per generation, one warm per WARM_BEAT_S (a
    wait polls every 50 ms), and none for a generation that is not there."""
    store, job = world
    monkeypatch.setattr(worker_module, "WARM_BEAT_S", 0.2)
    name(store, "g1", 1, assignment=None)  # named, never assigned
    rank = warm(job, wait_s=0.6)
    beats = []
    real = rank.link.heartbeat

    def counted(generation, slot, state, **kwargs):
        beats.append((generation, state))
        return real(generation, slot, state, **kwargs)

    monkeypatch.setattr(rank.link, "heartbeat", counted)
    assert rank.await_target(after=None) is None  # a new rank: the wait runs out
    assert beats == [("g1", "ready")]
    beats.clear()
    assert rank.await_target(after="g0") is None  # a rank that trained g0
    warm_beats = [b for b in beats if b == ("g0", "warm")]
    assert 2 <= len(warm_beats) <= 4 and beats[-1] == ("g0", "stopped")


def test_a_second_process_for_a_slot_leaves_at_once(world):
    """Slot 0 of g1 is already another process's: this one leaves, it does not wait warm
    (it would train the slot a second time in the next generation)."""
    import datetime

    import torch.distributed as dist

    store, job = world
    name(store, "g1", 1)
    rank = warm(job, wait_s=5)
    rdzv = rank.rdzv
    rdzv._base = dist.TCPStore(rdzv.host, rdzv.port, None, True, datetime.timedelta(seconds=10),
                               wait_for_workers=False)
    dist.PrefixStore("kale/g1/", rdzv._base).compare_set("slot/0", "", "another-process")
    t0 = time.monotonic()
    assert rank.serve() == 0
    assert time.monotonic() - t0 < 4 and rank.generation is None


def test_a_ranks_model_trains_at_the_reference_learning_rate(world):
    from kale_airflow.runtime.model import CTRTrainer

    _, job = world
    rank = job("--assignment", '{"0": [["0", 1.0]]}')
    assert rank.replica.optimizer.param_groups[0]["lr"] == CTRTrainer().lr


def test_a_removed_rank_waits_as_a_spare_past_warm_wait_and_says_ready_when_named(world):
    store, job = world
    two = {"0": [["0", 0.5]], "1": [["0", 0.5], ["0", 1.0]]}
    name(store, "g2", 1)  # a scale-down removed slot 1, which trained g1
    rank = job("--warm-wait", "0.3", "--standby", "1", "--rendezvous", f"127.0.0.1:{free_port()}", slot=1)
    threading.Timer(1.0, lambda: name(store, "g3", 2, assignment=two)).start()
    t0 = time.monotonic()
    assert rank.await_target(after="g1") == ("g3", {"assignment": two})  # kept past --warm-wait as a spare
    assert time.monotonic() - t0 >= 0.9
    assert state_of(store, "g3", slot=1) == "ready"  # the larger generation's old ranks need not wait for it
    assert state_of(store, "g2", slot=1) is None  # a spare says nothing to the generation it is not in


def test_a_spare_named_before_its_assignment_waits_a_whole_warm_wait_from_then(world):
    store, job = world
    two = {"0": [["0", 0.5]], "1": [["0", 0.5], ["0", 1.0]]}
    name(store, "g2", 1)
    rank = job("--warm-wait", "1.0", "--standby", "1", "--rendezvous", f"127.0.0.1:{free_port()}", slot=1)
    threading.Timer(2.0, lambda: name(store, "g3", 2, assignment=None)).start()  # sized, not yet rebalanced
    threading.Timer(2.4, lambda: name(store, "g3", 2, assignment=two)).start()
    assert rank.await_target(after="g1") == ("g3", {"assignment": two})  # a spare for 2 s, then 0.4 s of wait


def test_a_spare_beyond_the_window_leaves(world):
    store, job = world
    name(store, "g2", 1)
    rank = job("--warm-wait", "5", "--standby", "1", "--rendezvous", f"127.0.0.1:{free_port()}", slot=2)
    t0 = time.monotonic()
    assert rank.await_target(after=None) is None
    assert time.monotonic() - t0 < 4


def test_a_spare_leaves_when_signalled(world):
    store, job = world
    name(store, "g2", 1)
    rank = job("--warm-wait", "60", "--standby", "2", "--rendezvous", f"127.0.0.1:{free_port()}", slot=1)
    threading.Timer(0.5, lambda: worker_module._signalled.append(15)).start()
    t0 = time.monotonic()
    assert rank.await_target(after="g1") is None
    assert time.monotonic() - t0 < 5
    assert state_of(store, "g1", slot=1) == "stopped"


def test_a_spare_leaves_when_the_pool_that_started_it_is_gone(world, caplog):
    store, job = world
    name(store, "g2", 1)
    rank = job("--warm-wait", "60", "--standby", "2", "--rendezvous", f"127.0.0.1:{free_port()}", slot=1)
    rank.parent = -1  # as if it had been started by a process that has since exited
    assert rank.await_target(after=None) is None
    assert "pool supervisor is gone" in caplog.text
