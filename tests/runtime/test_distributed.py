"""The generation as one torch.distributed job on CPU (gloo), started the way production
starts it (``LocalWorkers``: one supervisor, one process per rank, 127.0.0.1 rendezvous):
synchronized parameters, a rank with no data, kill -9 of one rank (the whole job restarts
from its one checkpoint; audited per step, in samples, from what reached the model), and a
world size 3 -> 2 -> 3 across generations with one model continuing."""

import json
from collections import defaultdict

import numpy as np
import psutil
import pytest

from kale_airflow.control.generations import handover
from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import CHECKPOINT, Worker, parameter_hash
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import wait_until

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def fill(path, partitions, per_partition, chunk=1000):
    s = EmbeddedStream(path, partitions=partitions)
    for p in range(partitions):
        for c in range(per_partition // chunk):
            s.append(p, pack(generate(chunk, 100 * p + c)))
    return s


def audit_lines(path):
    """Audit rows: (slice, start, end, generation, t_start, step, samples, run, rank)."""
    out = []
    for line in open(path):
        p, lo, hi, a, b, gen, t0, _t1, step, k, run, rank = line.strip().split(",")
        out.append((Slice(int(p), float(lo), float(hi)), int(a), int(b), gen, float(t0), int(step), int(k), run,
                    int(rank)))
    return out


def offsets_of(sl, a, b):
    offs = np.arange(a, b)
    return offs[sl.mask(offs)]


def model_lineage(rows):
    """The rows whose updates the final model holds: for each (rank, step), the latest process
    that trained that step (a restart restores step c and re-trains c+1..: the older process's
    steps after c were thrown away with its state)."""
    first_seen = {}
    for r in rows:
        first_seen[r[7]] = min(first_seen.get(r[7], r[4]), r[4])
    latest = {}
    for r in rows:
        key = (r[8], r[5])
        if key not in latest or first_seen[r[7]] > first_seen[latest[key]]:
            latest[key] = r[7]
    return [r for r in rows if latest[(r[8], r[5])] == r[7]]


def coverage(rows, partition):
    """offset -> times it reached the model, after checking each row's sample count against
    its slice's offsets (the audit counts what was trained, not what was read)."""
    seen = defaultdict(int)
    for sl, a, b, *_rest in rows:
        if sl.partition != partition:
            continue
        offs = offsets_of(sl, a, b)
        assert _rest[3] == len(offs), f"{sl} [{a},{b}) read {len(offs)} samples but trained {_rest[3]}"
        for o in offs.tolist():
            seen[o] += 1
    return seen


def steps_of(path):
    return [json.loads(line) for line in open(path)]


def job(tmp_path, *extra, batch=100):
    spec = WorkerSpec(stream_url=f"sqlite:///{tmp_path / 's.db'}", checkpoint_dir=str(tmp_path / "ck"),
                      batch_size=batch, extra_args=["--audit", str(tmp_path / "audit.log"),
                                                    "--step-log", str(tmp_path / "steps.log"), *extra])
    return LocalWorkers(spec, tmp_path / "logs")


def test_every_rank_holds_the_same_parameters_after_every_step_and_the_loss_falls(tmp_path):
    s = fill(tmp_path / "s.db", 3, 4000)
    # Uneven on purpose: rank 0 has one partition, rank 1 two, rank 2 none (it still joins every step).
    doc = {"assignment": {"0": [["0", 1.0]], "1": [["1", 1.0], ["2", 1.0]], "2": []}}
    workers = job(tmp_path, "--exit-when-idle", "--checkpoint-every", "10")
    workers.start("g1", doc)
    assert workers.wait(timeout=240) == {0: 0}
    steps = steps_of(tmp_path / "steps.log")
    by_step = defaultdict(dict)
    for rec in steps:
        by_step[rec["step"]][rec["rank"]] = rec
    assert len(by_step) >= 30 and all(len(ranks) == 3 for ranks in by_step.values())
    for step, ranks in by_step.items():  # one model: the same parameter hash on every rank after every step
        assert len({r["hash"] for r in ranks.values()}) == 1, f"ranks diverged at step {step}"
    losses = [np.mean([r["loss"] for r in by_step[k].values() if r["loss"] == r["loss"]]) for k in sorted(by_step)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, losses
    rows = audit_lines(tmp_path / "audit.log")
    for p in range(3):  # every sample trained exactly once; the checkpoint's positions are the stream's commits
        seen = coverage(rows, p)
        assert set(seen) == set(range(4000)) and max(seen.values()) == 1
        assert s.committed(f"kale/p{p}:0.000000-1.000000", p) == 4000
    assert "0 slice(s)" in (tmp_path / "logs" / "g1-worker-2.log").read_text()
    # The check above tells a data-parallel job from replicas: two unsynchronized replicas
    # trained on different slices hold different parameters after one step.
    a = Worker(s, "x", [Slice(0)], tmp_path / "a")
    b = Worker(s, "y", [Slice(1)], tmp_path / "b")
    assert parameter_hash(a.module) == parameter_hash(b.module)
    a.step(), b.step()
    assert parameter_hash(a.module) != parameter_hash(b.module)


def test_kill_9_of_one_rank_restarts_the_job_from_its_checkpoint_and_the_model_misses_no_sample(tmp_path):
    per, batch, every = 6000, 100, 7
    s = fill(tmp_path / "s.db", 2, per)
    doc = {"assignment": {"0": [["0", 1.0], ["1", 0.5]], "1": [["1", 0.5]]}}
    # An emulated 50 ms step keeps the job busy for a while, so the kill lands mid-training.
    workers = job(tmp_path, "--exit-when-idle", "--checkpoint-every", str(every), "--step-time", "0.05", batch=batch)
    workers.start("g1", doc)
    log = tmp_path / "steps.log"
    # Past the first checkpoint and some steps beyond it: the kill throws trained steps away.
    wait_until(lambda: log.exists() and any(r["step"] >= every + 3 for r in steps_of(log)), "no training")
    (sup,) = workers.procs.values()
    ranks = sorted(psutil.Process(sup.pid).children(), key=lambda p: p.create_time())
    assert len(ranks) == 2
    ranks[1].kill()  # SIGKILL of rank 1 mid-step: no checkpoint on the way out
    killed_at = max(r["step"] for r in steps_of(log))
    assert any(s.committed(f"kale/{sl.group_suffix}", sl.partition) < per
               for w in (0, 1) for sl in slices_for(doc, w)), "the job finished before the kill"
    assert workers.wait(timeout=240) == {0: 0}  # nobody restarted it by hand: the supervisor did
    logs = {r: (tmp_path / "logs" / f"g1-worker-{r}.log").read_text() for r in (0, 1)}
    assert "rank 1 pid" in logs[1] and "ended with signal SIGKILL; restart 1/3" in logs[1]
    assert "restart 1/3" in logs[0]  # the whole job restarted, not one rank
    restored = [int(line.split("restored model.pt (step ")[1].split(",")[0])
                for line in logs[0].splitlines() if "restored model.pt (step " in line]
    assert len(restored) == 1 and restored[0] % every == 0 and restored[0] < killed_at, (restored, killed_at)

    rows = audit_lines(tmp_path / "audit.log")
    kept = model_lineage(rows)
    assert len({r[7] for r in rows}) == 4 and len({r[7] for r in kept}) == 4  # 2 ranks x 2 processes
    replayed = len(rows) - len(kept)
    assert replayed > 0, "the kill threw no trained step away: the test did not exercise a replay"
    for p in range(2):
        model = coverage(kept, p)
        # What the final model trained: every sample of the stream, exactly once.
        assert set(model) == set(range(per)), f"partition {p}: {per - len(model)} samples never reached the model"
        assert max(model.values()) == 1
        trained = coverage(rows, p)
        assert max(trained.values()) <= 2  # the replay since the checkpoint, once
        slices = sum(1 for w in (0, 1) for sl in slices_for(doc, w) if sl.partition == p)
        # at most `every` steps since the checkpoint, each reading about batch / slices-per-rank per slice
        assert sum(trained.values()) - per <= every * slices * (batch + 2)
    ck = __import__("torch").load(tmp_path / "ck" / CHECKPOINT, weights_only=False)
    assert {(p, pos) for p, lo, hi, pos in ck["slices"]} == {(0, per), (1, per)}
    assert ck["steps"] == max(r["step"] for r in steps_of(log))


def test_world_size_3_then_2_then_3_continues_one_model(tmp_path):
    from kale_airflow.core.rebalance import assign

    per = 3000
    s = fill(tmp_path / "s.db", 3, per)
    rates = {str(p): 1.0 for p in range(3)}
    docs, previous = [], None
    for gen, n, stop in (("g1", 3, ["--max-steps", "8"]), ("g2", 2, ["--max-steps", "8"]),
                         ("g3", 3, ["--exit-when-idle"])):
        doc = assign(rates, n, previous).to_dict()
        if previous:
            handover(s, "kale", previous, doc)  # what the rebalance does between generations
        workers = job(tmp_path, "--checkpoint-every", "5", *stop)
        workers.start(gen, doc)
        assert workers.wait(timeout=240) == {0: 0}, gen
        docs.append(doc)
        previous = {"assignment": doc["assignment"]}
    steps = steps_of(tmp_path / "steps.log")
    world = {r["generation"]: r["world"] for r in steps}
    assert world == {"g1": 3, "g2": 2, "g3": 3}
    order = [r["step"] for r in steps if r["rank"] == 0]
    assert order == sorted(order) and order == list(range(1, len(order) + 1))  # one counter, never reset
    first = {g: min(r["step"] for r in steps if r["generation"] == g) for g in world}
    assert first == {"g1": 1, "g2": 9, "g3": 17}
    for rank_log, step in (("g2-worker-0.log", 8), ("g3-worker-0.log", 16)):
        assert f"restored model.pt (step {step}," in (tmp_path / "logs" / rank_log).read_text()
    by_step = defaultdict(set)
    for r in steps:
        by_step[r["step"]].add(r["hash"])
    assert all(len(h) == 1 for h in by_step.values())
    rows = audit_lines(tmp_path / "audit.log")
    for p in range(3):
        seen = coverage(rows, p)
        assert set(seen) == set(range(per)) and max(seen.values()) <= 2
