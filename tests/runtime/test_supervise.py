"""The local supervisor tells a dependency outage from a crash loop and a refusal, and marks
the job's heartbeats ``failed`` when it gives up (the crash loop itself: test_worker.py)."""

import sys

import pytest

from kale_airflow.runtime.supervise import (
    EXIT_DEPENDENCY,
    EXIT_REFUSED,
    Supervisor,
    main,
)
from kale_airflow.store import StateStore


def exits(tmp_path, *codes):
    """A command that exits with ``codes`` in turn over its runs (then 0)."""
    counter = tmp_path / "runs"
    script = (f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) if p.exists() else 0; "
              f"p.write_text(str(n + 1)); codes = {list(codes)!r}; sys.exit(codes[n] if n < len(codes) else 0)")
    return [sys.executable, "-c", script]


@pytest.mark.parametrize("codes, ran_s, give_up, delay", [
    ([3], 0.0, False, 2.0),                  # a crash: restart 1/1 after the backoff
    ([EXIT_REFUSED], 0.0, True, 0.0),        # a refusal: never restarted
    ([EXIT_DEPENDENCY], 0.0, False, 2.0),    # an outage: restarted, not counted
    ([-9, EXIT_DEPENDENCY], 0.0, False, 2.0),  # one rank's outage broke its peer's collective
], ids=["crash", "refused", "outage", "outage-with-a-broken-peer"])
def test_a_failed_run_is_judged_by_its_exit_codes(codes, ran_s, give_up, delay):
    sup = Supervisor(["x"], max_restarts=1, backoff_s=2.0)
    assert sup.verdict(codes, ran_s)[:2] == (give_up, delay)


def test_outage_restarts_back_off_to_a_cap_and_give_up_only_after_the_deadline():
    sup = Supervisor(["x"], max_restarts=1, backoff_s=2.0, outage_deadline_s=600.0)
    delays = [sup.verdict([EXIT_DEPENDENCY], 1.0, now=10.0 * k)[1] for k in range(8)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]  # 8 restarts, max_restarts 1: no give-up
    give_up, _, then = sup.verdict([EXIT_DEPENDENCY], 1.0, now=600.0)
    assert give_up and "dependency outage for 600 s" in then and "--outage-deadline" in then
    sup = Supervisor(["x"], max_restarts=1, backoff_s=2.0)
    sup.verdict([3], 1.0)
    assert sup.verdict([3], 1.0)[0]  # two crashes in a row with one restart allowed: a crash loop
    assert not sup.verdict([3], 120.0)[0]  # a run that was healthy resets the count


def test_a_dependency_outage_is_not_a_crash_loop(tmp_path, capfd):
    code = main(["--max-restarts", "1", "--backoff", "0", "--", *exits(tmp_path, *[EXIT_DEPENDENCY] * 4)])
    out = capfd.readouterr().out
    assert code == 0 and out.count("dependency outage (exit code 75") == 4 and "giving up" not in out
    assert "do not count toward --max-restarts" in out


def test_an_outage_past_the_deadline_gives_up_and_marks_the_job_failed(tmp_path, capfd, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    monkeypatch.setenv("KALE_DATABASE_URL", url)
    StateStore(url).worker_seen("g4", 0, "running")
    code = main(["--backoff", "0.05", "--outage-deadline", "0.3", "--",
                 *exits(tmp_path, *[EXIT_DEPENDENCY] * 1000), "--generation", "g4", "--worker-id", "0"])
    out = capfd.readouterr().out
    assert code == EXIT_DEPENDENCY and "giving up after --outage-deadline 0.3 s" in out
    assert StateStore(url).workers_seen("g4")[0]["state"] == "failed"  # no dead job keeps saying running


def test_a_refusal_is_not_restarted_and_every_rank_is_marked_failed(tmp_path, capfd, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    monkeypatch.setenv("KALE_DATABASE_URL", url)
    code = main(["--ranks", "2", "--log-dir", str(tmp_path / "logs"), "--",
                 sys.executable, "-c", f"import sys; sys.exit({EXIT_REFUSED})", "--generation", "g5"])
    out = capfd.readouterr().out
    assert code == EXIT_REFUSED and "refused to run" in out and "not restarting" in out
    assert "restart 1" not in out and out.count("job of 2 rank(s) started") == 1
    assert {r: rec["state"] for r, rec in StateStore(url).workers_seen("g5").items()} == {0: "failed", 1: "failed"}
    assert "marked generation g5's rank(s) 0, 1 failed" in out


def test_marking_a_job_failed_is_best_effort(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("KALE_DATABASE_URL", "postgresql://kale@127.0.0.1:1/kale")  # nobody listens there
    code = main(["--max-restarts", "0", "--", sys.executable, "-c", "import sys; sys.exit(3)", "--generation", "g6"])
    out = capfd.readouterr().out
    assert code == 3 and "could not mark generation g6 failed" in out and "heartbeats go stale instead" in out


# ------------------------------------------------------------------ the warm pool
@pytest.mark.parametrize("want, alive, exited, plan", [
    (3, {0, 1}, {}, ([2], False, False)),          # scale-up: start only the added slot
    (2, {0, 1, 2}, {}, ([], False, False)),         # scale-down: slot 2 leaves by itself
    (2, {0}, {1: 0}, ([1], False, False)),          # slot 1 left (its wait ran out) but is wanted: again
    (2, {0}, {1: -9}, ([], True, True)),            # a crash: every slot restarts from the checkpoint
    (2, {1}, {0: 0}, ([], True, False)),            # slot 0 hosts the store: a new attempt, not a failure
    (None, {0}, {}, ([], False, False)),            # the control plane cannot say: keep what runs
    (0, set(), {}, ([], False, False)),             # a generation of no workers: the pool ends
], ids=["scale-up", "scale-down", "rejoin", "crash", "slot-0", "unknown", "zero"])
def test_the_pool_starts_added_slots_and_restarts_all_after_a_failure(want, alive, exited, plan):
    from kale_airflow.runtime.supervise import pool_plan

    assert pool_plan(want, alive, exited) == plan


@pytest.mark.parametrize("want, alive, exited, standby, most, plan", [
    (1, {0}, {}, 2, 6, ([1, 2], False, False)),            # spares above the size
    (2, {0, 1, 2, 3}, {}, 2, 6, ([], False, False)),       # a scale-up onto spares starts nothing
    (4, {0, 1, 2, 3}, {}, 4, 6, ([4, 5], False, False)),   # never slot `most` or higher
    (6, {0, 1, 2, 3, 4, 5}, {}, 4, 6, ([], False, False)),
    (5, set(), {}, 4, 3, ([0, 1, 2, 3, 4], False, False)),  # the generation's own slots whatever `most` says
    (1, {0}, {}, 2, None, ([1, 2], False, False)),          # no cap given
    (0, set(), {}, 4, 6, ([], False, False)),               # stopped: no spare
    (2, {1, 2}, {}, 2, 6, ([], True, False)),               # slot 0 still restarts everything
    (2, {0, 1, 2}, {3: 1}, 2, 6, ([], True, True)),         # a spare that fails is a failure too
], ids=["spares", "onto-spares", "cap", "full", "over-cap", "no-cap", "zero", "slot-0", "spare-failed"])
def test_the_pool_keeps_spares_above_the_generation(want, alive, exited, standby, most, plan):
    from kale_airflow.runtime.supervise import pool_plan

    assert pool_plan(want, alive, exited, standby, most) == plan


def test_the_pool_says_why_it_restarts():
    from kale_airflow.runtime.supervise import EXIT_RENDEZVOUS, restart_reason

    assert restart_reason({1: -9, 0: 3}) == "restart after slot 0 ended with exit code 3"
    assert "did not all meet in time (slot 1)" in restart_reason({1: EXIT_RENDEZVOUS})
    assert "slot 0 started again" in restart_reason({0: 0})


WAITING_RANK = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                "print('waiting', flush=True); time.sleep(600)")  # a warm rank waiting for its next generation


def pool(tmp_path, url, *options):
    """``supervise --pool`` over a stand-in rank (started in its own process: it handles signals)."""
    import os
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "kale_airflow.runtime.supervise", "--pool", "--log-dir",
                             str(tmp_path / "logs"), *options, "--", sys.executable, "-c", WAITING_RANK],
                            env=os.environ | {"KALE_DATABASE_URL": url}, stdout=subprocess.PIPE, text=True)


def test_a_pool_whose_deployment_stopped_tells_its_waiting_ranks_to_stop_and_ends(tmp_path):
    """Bug class: a pool (and its warm ranks) outliving the deployment's stop for as long as the
    ranks wait for a generation that will never come (the leak of a test's pool)."""
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    store = StateStore(url)
    store.set_current_generation("g1", 1)
    proc = pool(tmp_path, url)
    from tests.conftest import wait_until

    wait_until(lambda: (tmp_path / "logs" / "worker-0.log").exists()
               and "waiting" in (tmp_path / "logs" / "worker-0.log").read_text(), "the rank started")
    store.set_current_generation("stopped", 0)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "slot 0 is told to stop" in out and "wants no worker and none runs: the pool ends" in out


def test_a_pool_without_slots_ends_once_the_control_plane_outlasts_the_deadline(tmp_path):
    """Bug class: a pool that cannot read the current generation waiting forever with nothing to keep."""
    (tmp_path / "a-file").write_text("")  # a database under a file cannot be opened
    proc = pool(tmp_path, f"sqlite:///{tmp_path / 'a-file' / 'kale.db'}", "--outage-deadline", "0.5")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_DEPENDENCY, out
    assert "unreachable for --outage-deadline 0.5 s and no slot runs: the pool ends" in out
