"""The autoscaler DAG for real (dag.test, triggers in-process) against a live stream:
a traffic jump scales up, a drop scales down only after stabilization, and the training
DAG rebalances and starts local workers for the new generation.

A loop test's DAG runs all go through its home's one long-lived ``dag.test`` process
(tests/airflow_harness.py), as the autoscaler's trigger runs in a deployment's long-lived
triggerer; what carries over between runs is still only what the control store persists
(each run builds its own autoscaler)."""

import subprocess
import sys
import time

import pytest
import yaml

from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import seed_simulated_throughput, wait_until

pytestmark = pytest.mark.slow

# The producer of both loop tests (embedded and Kafka): argv = stream URL, rate file.
PRODUCER = r"""
import sys, time
from pathlib import Path
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.stream import StreamError, open_stream
url = sys.argv[1]
if url.startswith("kafka://"):  # a broker on a loaded machine may take long to acknowledge
    from kale_airflow.stream.kafka import KafkaStream
    s = KafkaStream.from_url(url, timeout_s=60)
else:
    s = open_stream(url)
rate_file = Path(sys.argv[2])
payload = pack(generate(200, 1))
i, last, owed, started = 0, time.monotonic(), 0.0, False
while True:  # keeps the file's rate even when a loaded machine delays the loop
    time.sleep(0.2)
    now = time.monotonic()
    owed += float(rate_file.read_text()) * (now - last)  # the test replaces the file atomically
    last, n = now, int(owed)
    owed -= n
    if n:
        try:
            s.append(i % 4, (payload * (n // 200 + 1))[:n])
        except StreamError as exc:  # a broker slowed down by the loaded machine: the records stay queued
            print(f"producer: {exc}", file=sys.stderr)
        else:
            if not started:  # what the test waits for (producing())
                rate_file.with_suffix(".started").touch()
                started = True
    i += 1
"""


# Seconds stand for hours. The policy plans with the measured rescale pause (decision -> the
# new workers' first step), which here spans the test's own training DAG run (45-67 s on a
# loaded 2-core machine), capped at half the 30 s horizon: a scale-down from 6 is then worth
# its pause only at a low price of lag. A change must be the plan's first move for 5 s.
LOOP_CONFIG = {"min_workers": 1, "max_workers": 6, "poll_interval_s": 1, "bin_s": 5, "rescale_downtime_s": 1,
               "kale": {"horizon_s": 30, "persist_s": 5, "wait_cost": 0.1}}


def prepare_loop(airflow_home, **config):
    """Write the loop's configuration (``LOOP_CONFIG`` plus ``config``), the producer's rate
    file (2,500 samples/s), and register the champions: the seasonal forecaster (its fallback
    level spans the 10 s look-ahead, not an hour, which would average the whole test, the jump
    included) and the throughput model fitted on the simulator's profile of its cluster."""
    home = airflow_home.kale_home
    home.mkdir(parents=True, exist_ok=True)
    (home / "kale.yaml").write_text(yaml.safe_dump(LOOP_CONFIG | config))
    rate = home / "rate.txt"
    rate.write_text("2500")
    # What the cluster measured is not this test's subject: the simulator's profile stands in for it.
    seed_simulated_throughput(store_url(airflow_home))
    for dag_id, conf in (("kale_forecaster_retrain", {"forecaster": "seasonal", "history_days": 3,
                                                      "forecaster_options": {"level_window_s": 10},
                                                      "auto_promote": True}),
                         ("kale_throughput_refit", {})):
        run = airflow_home.run(dag_id, conf)
        assert run.state == "success", run.log[-2000:]
    return rate


def stop_workers(airflow_home) -> None:
    """End the test's generation; the workers the training DAG started must stop the way every
    superseded worker does."""
    store = store_of(airflow_home)
    store.set_current_generation("test-finished", 0)
    deadline = time.monotonic() + 30
    while store.running_workers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert store.running_workers() == [], "workers kept training after their generation was superseded"


@pytest.fixture
def live(airflow_home):
    """The loop's world on the embedded default (SQLite control plane). The same scenario runs
    with a PostgreSQL control plane on Kafka (tests/stream/test_autoscaler_loop_kafka.py)."""
    home = airflow_home.kale_home
    home.mkdir(parents=True, exist_ok=True)
    EmbeddedStream(home / "stream.db", partitions=4)
    rate = prepare_loop(airflow_home)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, f"sqlite:///{home / 'stream.db'}", str(rate)])
    yield airflow_home, rate
    proc.kill()
    proc.wait()
    stop_workers(airflow_home)


def store_url(home) -> str:
    """The loop's control-plane database (PostgreSQL when the environment names one)."""
    return home.env.get("KALE_DATABASE_URL") or f"sqlite:///{home.kale_home / 'kale.db'}"


def store_of(home) -> StateStore:
    return StateStore(store_url(home))


def set_rate(path, rate):
    """Replace the producer's rate file atomically (a half-written file would kill the producer)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(rate))
    tmp.replace(path)


def producing(rate) -> None:
    """Return once the producer has been appending for two seconds: the first poll's arrival
    rate (over its last ``poll_interval_s``) must see its traffic, however slowly it started."""
    wait_until(rate.with_suffix(".started").exists, "the producer appended its first records")
    time.sleep(2)


def decisions(home):
    return store_of(home).decisions()


def test_jump_scales_up_and_drop_scales_down_only_after_stabilization(live):
    home, rate = live
    producing(rate)
    run = home.run("kale_autoscaler", {"poll_interval_s": 1, "max_polls": 30})
    assert run.state == "success", run.log[-3000:]
    store = store_of(home)
    first = store.current()
    start = decisions(home)[-1]
    assert "no training generation is running" in start["message"]
    assert first["workers"] == start["target"] >= 3, start["message"]  # ~2,500 samples/s at ~1,000 per worker
    assert run.tasks["start_generation"] == "success"

    # The training DAG for that generation: rebalance, then local workers start.
    train = home.run("kale_training", {"workers": first["workers"], "generation": first["generation"]})
    assert train.state == "success", train.log[-3000:]
    assert store.get("default", first["generation"])["workers"] == first["workers"]
    assert "start_local_workers" in train.tasks and train.tasks["worker_pods"] != "success"

    # Traffic jump twice what max_workers (6) absorb: the running count can never drain the
    # queue, so the SLO binds and the scale-up goes at once, straight to 6 however noisy the
    # measured rate is (any later change can only be a scale-down).
    set_rate(rate, 12000)
    jumped = time.time()
    time.sleep(2)
    run = home.run("kale_autoscaler", {"poll_interval_s": 1, "max_polls": 30})
    assert run.state == "success", run.log[-3000:]
    up = decisions(home)[-1]
    assert up["reason"] == "scale_up_slo_risk" and up["target"] > first["workers"], up
    wanted_up = [d for d in decisions(home) if d["ts"] >= jumped and (d.get("plan_workers") or 0) > d["workers"]]
    assert wanted_up[0] == up, f"the SLO-bound scale-up waited: {wanted_up[:8]}"  # not held to stabilize
    second = store.current()
    assert second["workers"] == up["target"] == 6
    train = home.run("kale_training", {"workers": second["workers"], "generation": second["generation"]})
    assert train.state == "success", train.log[-3000:]
    assert "moved" in train.log  # the rebalancer logged what moved from the first generation

    set_rate(rate, 1000)  # traffic drop: the scale-down must stay the plan's first move for 5 s first
    time.sleep(3)
    run = home.run("kale_autoscaler", {"poll_interval_s": 1, "max_polls": 3})
    assert run.state == "success", run.log[-3000:]
    assert store.current()["workers"] == second["workers"], "scaled down before stabilization"
    assert run.tasks["start_generation"] == "skipped"
    run = home.run("kale_autoscaler", {"poll_interval_s": 1, "max_polls": 90})
    assert run.state == "success", run.log[-3000:]
    made = decisions(home)
    down = made[-1]
    assert down["reason"] == "scale_down_forecast" and down["target"] < second["workers"], made[-8:]
    holds = {d["reason"] for d in made}
    assert holds & {"hold_stabilizing", "hold_tolerance", "hold_rescaling"}
    # The plan wanted that scale-down for persist_s before it was applied: held while wanted.
    # The persisted want ends where a plan kept the count; a hold made before any planning
    # (a rescale in progress: no plan_workers) neither starts nor ends it.
    since = down
    for d in reversed(made[:-1]):
        if d["workers"] != second["workers"] or (d.get("plan_workers") is not None
                                                 and d["plan_workers"] >= d["workers"]):
            break
        if d.get("plan_workers") is not None:
            since = d
    persisted = down["ts"] - since["ts"]
    assert persisted >= LOOP_CONFIG["kale"]["persist_s"] - 1e-6, \
        f"scaled down {persisted:.1f} s after the plan first wanted it: {made[-10:]}"


def test_models_unavailable_keeps_the_current_workers(airflow_home):
    home = airflow_home.kale_home
    home.mkdir(parents=True, exist_ok=True)
    (home / "kale.yaml").write_text(yaml.safe_dump({"poll_interval_s": 1}))
    EmbeddedStream(home / "stream.db", partitions=2)
    StateStore(home / "kale.db").set_current_generation("g0", 4)
    run = airflow_home.run("kale_autoscaler", {"poll_interval_s": 1, "max_polls": 2},
                           extra_env={"KALE_MLFLOW_URI": "http://127.0.0.1:9"})
    assert run.state == "success"
    last = StateStore(home / "kale.db").decisions()[-1]
    assert last["target"] == 4 and last["reason"] == "hold_missing_metrics"
    assert "MLflow at http://127.0.0.1:9 is unreachable" in last["message"]
    assert run.tasks["start_generation"] == "skipped"
