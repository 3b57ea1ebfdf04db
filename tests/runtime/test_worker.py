"""The reference worker: learning, slices, checkpoint/restore, SIGTERM, kill -9, bad samples."""

import os
import sys
import time

import numpy as np
import psutil
import pytest

from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=3)
    for p in range(3):
        for chunk in range(4):
            s.append(p, pack(generate(1000, seed=10 * p + chunk)))
    return s


def audit_coverage(path):
    """offset -> times trained, per partition, from the audit log and slice masks."""
    seen: dict[int, dict[int, int]] = {}
    for line in open(path):
        p, lo, hi, a, b = line.strip().split(",")[:5]
        sl = Slice(int(p), float(lo), float(hi))
        offs = np.arange(int(a), int(b))
        for o in offs[sl.mask(offs)]:
            seen.setdefault(int(p), {}).setdefault(int(o), 0)
            seen[int(p)][int(o)] += 1
    return seen


def test_worker_learns_and_commits_after_each_step(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0), Slice(1), Slice(2)], tmp_path / "ck", batch_size=300)
    w.step()
    first = w.last_loss
    out = w.run(exit_when_idle=True)
    assert out["trained"] == 12_000 and out["malformed"] == 0
    assert w.last_loss < first - 0.05  # it learned something
    assert stream.lag("g/p0:0.000000-1.000000") == {0: 0, 1: 4000, 2: 4000}  # per-slice groups


def test_slices_of_one_partition_never_overlap_and_cover_it(stream, tmp_path):
    doc = {"assignment": {"0": [["0", 0.3]], "1": [["0", 0.7]]}}
    s0, s1 = slices_for(doc, 0), slices_for(doc, 1)
    assert s0 == [Slice(0, 0.0, 0.3)] and s1 == [Slice(0, 0.3, 1.0)]
    offs = np.arange(4000)
    m0, m1 = s0[0].mask(offs), s1[0].mask(offs)
    assert not (m0 & m1).any() and (m0 | m1).all()
    assert abs(m0.mean() - 0.3) < 0.01


def test_malformed_samples_are_skipped_and_counted(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(100, 1)) + [b"garbage", b""] + pack(generate(50, 2)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck")
    out = w.run(exit_when_idle=True)
    assert out == out | {"trained": 150, "malformed": 2}
    assert s.lag("g/p0:0.000000-1.000000") == {0: 0}


def test_checkpoint_restore_round_trip(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    w.run(max_steps=3)
    w2 = Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    assert w2.restored_from and w2.steps == 3
    for a, b in zip(w.model.state_dict().values(), w2.model.state_dict().values()):
        assert (a == b).all()


def test_superseded_generation_stops_with_a_checkpoint(stream, tmp_path):
    control = StateStore(tmp_path / "kale.db")
    control.set_current_generation("g2")
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", control=control)
    out = w.run(report_every_s=0.0)
    assert out["steps"] == 1 and os.path.exists(out["checkpoint"])



def test_the_database_url_reaches_workers_through_the_environment_never_argv(tmp_path):
    url = "postgresql://kale:s3cret@db.kale:5432/kale"
    spec = WorkerSpec(stream_url="sqlite:///s.db", checkpoint_dir=str(tmp_path), database_url=url)
    cmd = spec.command("g1", 0, 1, {"assignment": {"0": [["0", 1.0]]}})
    assert not any("s3cret" in a for a in cmd) and "--database-url" not in cmd and "s3cret" not in repr(spec)
    assert spec.environment() == {"KALE_DATABASE_URL": url}
    assert WorkerSpec(stream_url="sqlite:///s.db", checkpoint_dir=str(tmp_path)).environment() == {}


def test_the_worker_command_opens_the_database_named_by_kale_database_url(stream, tmp_path, monkeypatch, caplog):
    from kale_airflow.runtime.worker import main

    url = f"sqlite:///{tmp_path / 'kale.db'}"
    StateStore(url).set_current_generation("g2")
    monkeypatch.setenv("KALE_DATABASE_URL", url)
    caplog.set_level("INFO")
    assert main(["--stream", f"sqlite:///{tmp_path / 's.db'}", "--assignment", '{"assignment": {"0": [["0", 1.0]]}}',
                 "--worker-id", "0", "--generation", "g1", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--max-steps", "50"]) == 0
    assert "generation g1 superseded: stopping" in caplog.text and "s3cret" not in caplog.text

def wait_until(condition, what, timeout=120):
    """Poll until ``condition()`` holds (a loaded CI machine may take seconds to start torch)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s")


def wait_for_log(path, text, timeout=120):
    wait_until(lambda: path.exists() and text in path.read_text(), f"{text!r} never appeared in {path}", timeout)


def spec(tmp_path, stream_path, *extra):
    return WorkerSpec(stream_url=f"sqlite:///{stream_path}", checkpoint_dir=str(tmp_path / "ck"),
                      batch_size=200, extra_args=list(extra))


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_zero_then_restart_resumes(tmp_path):
    path = tmp_path / "s.db"
    s = EmbeddedStream(path, partitions=1)
    for chunk in range(40):
        s.append(0, pack(generate(1000, chunk)))
    workers = LocalWorkers(spec(tmp_path, path, "--checkpoint-every", "1000000"), tmp_path / "logs")
    assignment = {"assignment": {"0": [["0", 1.0]]}}
    workers.start("g1", assignment)
    group = "kale/p0:0.000000-1.000000"
    wait_until(lambda: s.committed(group, 0) > 0, "the worker committed no step")
    assert workers.stop() == {0: 0}
    log = (tmp_path / "logs" / "g1-worker-0.log").read_text()
    assert "finishing the current step, then checkpointing" in log
    done = s.committed(group, 0)
    s.append(0, pack(generate(5000, 99)))  # new traffic while the worker was down
    workers.start("g1", assignment)
    wait_for_log(tmp_path / "logs" / "g1-worker-0.log", "restored worker-0.pt")
    wait_until(lambda: s.committed(group, 0) > done, "the restarted worker committed nothing")
    workers.stop()


@pytest.mark.slow
def test_kill_9_mid_training_restarts_and_loses_no_sample_and_duplicates_at_most_one_batch(tmp_path):
    path = tmp_path / "s.db"
    s = EmbeddedStream(path, partitions=2)
    for p in range(2):
        for chunk in range(30):
            s.append(p, pack(generate(1000, 100 * p + chunk)))
    audit = tmp_path / "audit.log"
    doc = {"assignment": {"0": [["0", 1.0], ["1", 0.5]], "1": [["1", 0.5]]}}
    # An emulated 50 ms GPU step keeps the workers busy for ~10 s, so the kill lands mid-training.
    workers = LocalWorkers(spec(tmp_path, path, "--audit", str(audit), "--checkpoint-every", "5",
                                "--step-time", "0.05"), tmp_path / "logs")
    workers.start("g1", doc)
    groups = [(f"kale/{sl.group_suffix}", sl.partition) for w in (0, 1) for sl in slices_for(doc, w)]
    wait_until(lambda: all(s.committed(g, p) > 0 for g, p in groups), "the workers did not start training")
    for sup in workers.procs.values():  # the workers themselves, not their supervisors
        for child in psutil.Process(sup.pid).children():
            child.kill()  # SIGKILL mid-training: no checkpoint on the way out
    assert any(s.lag(g)[p] for g, p in groups), "the workers finished before the kill"
    # Nobody restarts them by hand: their supervisors do, and they resume from checkpoints.
    wait_until(lambda: not any(s.lag(g)[p] for g, p in groups), "the restarted workers did not drain the stream")
    workers.stop()
    for w in (0, 1):
        assert "ended with signal SIGKILL; restart 1/3" in (tmp_path / "logs" / f"g1-worker-{w}.log").read_text()
    seen = audit_coverage(audit)
    batch = 200  # --batch-size: per slice a step reads at most ceil(batch / slices / share) records
    for p in range(2):
        trained = seen.get(p, {})
        assert set(trained) == set(range(30_000)), f"partition {p}: samples lost"
        dups = sum(c - 1 for c in trained.values())
        assert dups <= 2 * 2 * batch  # at most one uncommitted batch per slice (2 slices per partition at most)


def test_supervisor_gives_up_on_a_crash_loop_and_passes_exit_code_0_through(capfd):
    from kale_airflow.runtime.supervise import main

    assert main(["--max-restarts", "2", "--backoff", "0", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    out = capfd.readouterr().out
    assert out.count("restart") == 2 and "exit code 3, 3 failures in a row: giving up" in out
    assert main(["--", sys.executable, "-c", "pass"]) == 0
    assert "restart" not in capfd.readouterr().out
    with pytest.raises(SystemExit):
        main(["--max-restarts", "1"])  # no command


def test_handover_starts_new_slices_where_the_old_ones_stopped(stream, tmp_path):
    from kale_airflow.control.generations import handover

    old = {"assignment": {"0": [["0", 1.0]], "1": [["1", 1.0], ["2", 1.0]]}}
    for w in (0, 1):
        Worker(stream, "g", slices_for(old, w), tmp_path / "ck", worker_id=w).run(max_steps=3)
    reached = {p: stream.committed(f"g/p{p}:0.000000-1.000000", p) for p in range(3)}
    assert all(v > 0 for v in reached.values())
    new = {"assignment": {"0": [["0", 0.5]], "1": [["0", 0.5], ["1", 1.0]], "2": [["2", 1.0]]}}
    starts = handover(stream, "g", old, new)
    assert starts == {"g/p0:0.000000-0.500000": reached[0], "g/p0:0.500000-1.000000": reached[0]}
    # Training the new generation to the end covers every offset after the old position exactly.
    audit = tmp_path / "audit.log"
    for w in (0, 1, 2):
        Worker(stream, "g", slices_for(new, w), tmp_path / "ck2", worker_id=w, audit=audit).run(exit_when_idle=True)
    seen = audit_coverage(audit)
    assert set(seen[0]) == set(range(reached[0], 4000)) and max(seen[0].values()) == 1
    # Back to the first layout: its whole-partition slice of p0 still has the stale commit
    # of the first generation; it must start where the second one stopped, not re-read.
    assert handover(stream, "g", new, old) == {"g/p0:0.000000-1.000000": 4000}
    assert handover(stream, "g", new, old) == {}  # idempotent: nothing moves twice


@pytest.mark.parametrize("n", [1, 2, 513])
def test_any_batch_size_becomes_tensors(n):
    from kale_airflow.runtime.model import CTRModel, to_tensors

    user, item, dense, label = to_tensors(generate(n, 3))
    assert dense.shape == (n, 8) and label.shape == (n,)
    assert CTRModel()(user, item, dense).shape == (n,)
