"""Fault drills against real servers on loopback: what each fault costs the model and
whether the job comes back by itself. Writes ``benchmarks/results/chaos.json``.

    .venv/bin/python benchmarks/chaos.py [--json OUT] [--outage-scale F] [--only 1,3,...]

1. postgres-outage: PostgreSQL (initdb/pg_ctl) stopped 120 s under a 2-rank local job.
2. kafka-outage: the Kafka-protocol broker (Tansu) unreachable 60 s under a 2-rank job. Tansu
   keeps its log in memory (stopping it empties it: fault 5), so clients reach it through a
   TCP proxy, which is killed (connections reset, then refused) and restarted on its port.
   For both: training goes on, no sample is missing from the model, a sample is trained
   twice only within one checkpoint interval (the warm-rank audit of every sample).
3. concurrent-apply: ``Generations.apply()`` by 8 threads / 4 processes at once, one decision
   (same run id) or competing ones (different run ids), SQLite and PostgreSQL: one generation.
4. damaged-checkpoint: model.pt truncated, random bytes, zero length, deleted (commits kept):
   with no previous checkpoint the worker command refuses to start (non-zero exit, naming
   the file and --allow-fresh-model) and touches nothing; with one it resumes from
   model.prev.pt and keeps that file unchanged.
5. broker-restarted-empty: Tansu restarted empty under a worker: StreamPositionError naming
   partition, position and log end, on read and at start.
6. password-masking: user:password in KALE_MLFLOW_URI and KALE_DATABASE_URL through a local
   job, the autoscaler's poke, ``kale status``, ``kale decide --dry-run`` and the Kale page's
   JSON and HTML; the password is searched for in every file the run wrote, every table,
   output, log line and rank command line.

Per fault: recovered, samples missing, samples trained twice (all within one checkpoint
interval?), time to recover (s), a note. ``--outage-scale`` multiplies both outages (0.1: a
quick check; recorded in the JSON). The servers, deployment and audits are the tests'
fixtures (tests/conftest.py, tests/stream/conftest.py, tests/runtime/warm_harness.py).
About 10 minutes at scale 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import multiprocessing as mp
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from sqlalchemy import MetaData, create_engine, func, select  # noqa: E402

from kale_airflow.reporting.results import write_json  # noqa: E402
from kale_airflow.runtime.backends import LocalPool  # noqa: E402
from kale_airflow.store import StateStore  # noqa: E402
from kale_airflow.store.schema import generations  # noqa: E402
from kale_airflow.stream.kafka import KafkaStream  # noqa: E402
from tests.conftest import postgres_server as _postgres_fixture  # noqa: E402
from tests.conftest import wait_until  # noqa: E402
from tests.control.test_apply_races import RACERS, everyone_reads_before_anyone_writes  # noqa: E402
from tests.control.test_generations import FIRST, generations_on, scale  # noqa: E402
from tests.runtime.warm_harness import Deployment, Producer, audit_rows, exactly_once_audit  # noqa: E402
from tests.stream.conftest import Broker, _broker, _free_port, _start_tansu, _stop_tansu  # noqa: E402
from tests.stream.kafka_proxy import CountingProxy  # noqa: E402

PASSWORD = "s3cret-Pw0rd"
EVERY = 10  # checkpoint interval (steps) of the outage jobs
postgres = contextlib.contextmanager(_postgres_fixture.__wrapped__)  # the session fixture, as a context manager


def database(server) -> str:
    """A new, empty database on ``server``."""
    import psycopg

    name, admin = f"kale_{uuid.uuid4().hex[:12]}", server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


class PgDeployment(Deployment):
    """The tests' local deployment with its control plane on PostgreSQL."""

    def __init__(self, home: Path, url: str, **kw):
        super().__init__(home, **kw)
        self.url, self.env["KALE_DATABASE_URL"] = url, url

    @property
    def store(self):
        return StateStore(self.url)


def row(recovered, missing=None, twice=None, within=None, recover_s=None, note="", **details) -> dict:
    return {"recovered": bool(recovered), "missing": missing, "trained_twice": twice,
            "twice_within_checkpoint": within, "recover_s": recover_s, "note": note, "details": details}


@contextlib.contextmanager
def captured(path: Path):
    """Everything this process writes to fds 1 and 2 (prints, loggers bound to the original
    streams, C libraries) goes to ``path`` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved):
                os.dup2(old, fd)
                os.close(old)


def problems(d: Deployment) -> list[str]:
    """Exceptions (a traceback's last line), exits and restarts in the rank and supervisor
    logs (librdkafka's own connection lines left out)."""
    out = []
    for p in sorted((d.home / "worker-logs").glob("*.log")):
        out += [f"{p.name}: {ln.strip()[:500]}" for ln in p.read_text(errors="replace").splitlines()
                if not ln.startswith("%") and (re.match(r"(\[rank\d+\]: )?[\w.]+(Error|Exception)\b", ln)
                                               or re.search(r"exit code|restart|giving up|gave up|unreachable", ln))]
    return out[:24]


def stop_job(d: Deployment) -> None:
    """A generation of no workers; ranks and pool supervisor killed if they do not stop."""
    with contextlib.suppress(BaseException):
        d.finish(timeout=60)
    pool = LocalPool.__new__(LocalPool)
    pool.log_dir = d.home / "worker-logs"
    if not pool.log_dir.exists():  # no job was started
        return
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not (pool.running() or 0) > 0, "the pool supervisor did not exit", 15)
    for pid in [*d.slot_pids().values(), pool.running() or -1]:
        with contextlib.suppress(psutil.Error, ValueError):
            if pid > 0:
                psutil.Process(pid).kill()


def undrained(d: Deployment, ends: dict, timeout: float = 120.0) -> str | None:
    """None once every sample below ``ends`` reached the model, else why not (fails fast
    when no rank process is left)."""
    deadline, dead_since = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if exactly_once_audit(audit_rows(d.audit), d.partitions, ends, EVERY)["never"] == 0:
            return None
        dead_since = None if d.slot_pids() else (dead_since or time.monotonic())
        if dead_since and time.monotonic() - dead_since > 15:
            return "no rank process left running"
        time.sleep(0.5)
    return f"the stream was not trained to its end within {timeout:.0f} s"


def audited(d: Deployment, ends: dict, why: str | None, note: str, recover_s: float | None, **details) -> dict:
    """The outage's row from the audit of every sample below ``ends``; not recovered when
    ``why`` says so, the audit fails, or a rank crashed (even if the supervisor's restarts
    then brought the job back: training did not go on through the fault)."""
    a, found = exactly_once_audit(audit_rows(d.audit), d.partitions, ends, EVERY), problems(d)
    crashes = [ln for ln in found if re.match(r"worker-\d+\.log: (\[rank\d+\]: )?[\w.]+(Error|Exception)\b", ln)
               and "Connection closed by peer" not in ln]  # gloo's word for "the other rank died"
    restarts = sum("(restart after" in ln for ln in found)
    if crashes:
        why = (f"{why}; " if why else "") + (f"ranks crashed {len(crashes)} time(s), first: {crashes[0]}; the "
                                             f"supervisor restarted the job {restarts} time(s)")
    note = f"{why}; {note}" if why else note
    ok = a["ok"] and not why
    return row(ok, a["never"], a["duplicates"], a["duplicates_outside"] == 0, recover_s,
               note + ("" if a["ok"] else f"; audit {a}"), audit=a, crashes=crashes, supervisor_restarts=restarts,
               log_problems=found, **details)


# ------------------------------------------------------------------ 1. PostgreSQL outage
def postgres_outage(tmp: Path, pg, scale: float) -> dict:
    outage = 120.0 * scale
    d = PgDeployment(tmp / "pg-outage", database(pg), partitions=2, max_workers=2, batch=64, step_time_s=0.05,
                     checkpoint_every=EVERY)
    stopped, recover_s, why, steps = False, None, None, {}
    count = lambda: d.steps.read_text().count("\n")  # noqa: E731 - steps trained so far, all ranks
    with d.environment():
        producer = Producer(d.stream, 2, 400)
        producer.start()
        try:
            gen = d.scale(2)["generation"]
            d.first_step(gen)
            time.sleep(3)
            steps["before"] = count()
            pg.stop()
            stopped = True
            time.sleep(outage)
            steps["during"] = count() - steps["before"]
            pg.start()
            stopped, t_start = False, time.time()
            try:
                wait_until(lambda: len(seen := d.store.workers_seen(gen)) == 2 and all(
                    r["heartbeat"] > t_start and r["state"] == "running" for r in seen.values()),
                    "both ranks' heartbeats did not come back", 120)
                recover_s = time.time() - t_start
            except AssertionError as exc:
                why = str(exc)
            time.sleep(2)
            producer.stop()
            ends = d.stream.end_offsets()
            why = why or ("no step trained during the outage" if not steps["during"] else undrained(d, ends))
        finally:
            if stopped:
                pg.start()
            producer.stop()
            stop_job(d)
    back = sum("control-plane database back after" in p.read_text() for p in (d.home / "worker-logs").glob("*.log"))
    return audited(d, ends, why, f"{steps['during']} steps trained during the {outage:.0f} s outage; both ranks' "
                   f"heartbeats back; {back} rank log(s) say 'database back'", recover_s, outage_s=outage, steps=steps)


# ------------------------------------------------------------------ 2. Kafka broker outage
def kafka_outage(tmp: Path, _pg, scale: float) -> dict:
    outage, log = 60.0 * scale, tmp / "tansu-outage.log"
    port, front = _free_port(), _free_port()
    with contextlib.ExitStack() as cleanup:
        proxy = CountingProxy(front, port)  # what the clients reach: killing it is the outage
        cleanup.callback(lambda: proxy.close())  # the latest one
        broker = Broker(_start_tansu(port, log, advertised=front), f"127.0.0.1:{front}", log)
        cleanup.callback(lambda: _stop_tansu(broker.proc))
        url = broker.url(broker.create_topic(2))
        d = Deployment(tmp / "kafka-outage", partitions=2, max_workers=2, batch=64, step_time_s=0.05,
                       checkpoint_every=EVERY, extra={"stream_url": url})
        d.stream, recover_s = KafkaStream.from_url(url), None
        producer = Producer(d.stream, 2, 300)
        cleanup.enter_context(d.environment())
        cleanup.callback(lambda: stop_job(d))
        cleanup.callback(lambda: producer.stop())
        producer.start()
        d.first_step(d.scale(2)["generation"])
        time.sleep(3)
        producer.stop()  # the producer is cut off too; the subject is the job
        proxy.close()
        time.sleep(outage)
        proxy, t_start = CountingProxy(front, port), time.time()
        seed, producer = producer.seed, Producer(KafkaStream.from_url(url), 2, 300)
        producer.seed = seed
        producer.start()
        time.sleep(5)
        producer.stop()
        for p in range(2):  # a one-record batch last: Tansu's ListOffsets (tests/stream/test_kafka.py)
            producer.stream.append(p, producer.payloads(1, 10**6 + p))
        ends = producer.stream.end_offsets()
        why = undrained(d, ends)
        after = [r[5] for r in audit_rows(d.audit) if r[4] > t_start]
        recover_s = min(after) - t_start if after else None
    return audited(d, ends, why, f"broker unreachable {outage:.0f} s (proxy killed, Tansu kept its log); time to "
                   "recover: restart to the end of the first step that began after it", recover_s, outage_s=outage)


# ------------------------------------------------------------------ 3. concurrent apply
def contend(url, home, run_id, barrier, results, gens=None):
    """One contender: apply the same scale-up against the first generation, all at once."""
    gens = gens or generations_on(Path(home), url)
    seen = gens.store.current_generation()
    barrier.wait(timeout=120)
    try:
        results.put(gens.apply(scale(2, 4, seen=seen), run_id=run_id))
    except Exception as exc:  # noqa: BLE001 - reported
        results.put({"error": repr(exc)})


def race(home: Path, url: str | None, same_run: bool, processes: int = 0) -> dict:
    """``Generations.apply`` of one decision (same run id) or competing ones, by threads
    sharing one ``Generations`` (PostgreSQL: all read before anyone writes) or processes."""
    home.mkdir(parents=True)
    gens = generations_on(home, url)
    gens.apply(FIRST, run_id="first")
    n, ctx = processes or RACERS, mp.get_context("spawn")
    barrier, results = (ctx.Barrier(n), ctx.Queue()) if processes else (threading.Barrier(n), queue.Queue())
    release = (lambda: None) if processes else everyone_reads_before_anyone_writes(gens.store, n)
    runners = [(ctx.Process if processes else threading.Thread)(
        target=contend, args=(url, str(home), "race" if same_run else f"race{i}", barrier, results,
                              None if processes else gens)) for i in range(n)]
    for r in runners:
        r.start()
    got = [results.get(timeout=300) for _ in runners]
    for r in runners:
        r.join(60)
    release()
    with gens.store.db.connect() as c:
        made = c.execute(select(func.count()).select_from(generations)).scalar() - 1
    errors = [r["error"] for r in got if "error" in r]
    applied = sum(r.get("outcome") == "applied" for r in got)
    names = {r.get("generation") for r in got if "error" not in r}
    ok = not errors and made == 1 and applied == 1 and names == {gens.store.current_generation()}
    return {"backend": "postgres" if url else "sqlite", "runner": "processes" if processes else "threads",
            "run_ids": "same" if same_run else "different", "racers": n, "generations_made": made,
            "applied": applied, "outcomes": sorted({str(r.get("outcome")) for r in got}), "errors": errors, "ok": ok}


def concurrent_apply(tmp: Path, pg, _scale) -> dict:
    cases = []
    for procs in (0, 4):
        for backend in ("sqlite", "postgres"):
            for same in (True, False):
                url = database(pg) if backend == "postgres" else None  # a fresh control plane per race
                cases.append(race(tmp / f"apply-{len(cases)}", url, same, procs))
    bad = [c for c in cases if not c["ok"]]
    return row(not bad, note=f"{len(cases) - len(bad)}/{len(cases)} races made exactly one generation"
               + (f"; failed: {bad}" if bad else ""), cases=cases)


# ------------------------------------------------------------------ 4. damaged checkpoint
def worker_command(tmp: Path, damage, previous: bool) -> dict:
    from kale_airflow.runtime.samples import generate, pack
    from kale_airflow.stream.embedded import EmbeddedStream
    from tests.runtime.test_checkpoints import worker

    tmp.mkdir(parents=True)
    stream = EmbeddedStream(tmp / "s.db", partitions=1)
    for chunk in range(4):
        stream.append(0, pack(generate(500, chunk)))
    worker(stream, tmp).run(max_steps=3 if previous else 1)  # checkpoints at 2 and 3 / only at 1
    ck = tmp / "ck"
    damage(ck / "model.pt")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ck.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "kale_airflow.runtime.worker", "--stream", f"sqlite:///{tmp / 's.db'}",
                           "--group", "g", "--assignment", '{"assignment": {"0": [["0", 1.0]]}}', "--worker-id", "0",
                           "--checkpoint-dir", str(ck), "--max-steps", "2" if previous else "1"],
                          check=False, capture_output=True, text=True, timeout=300)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ck.iterdir()}
    text = proc.stdout + proc.stderr
    if previous:
        ok = proc.returncode == 0 and after.get("model.prev.pt") == before["model.prev.pt"] \
            and "cannot be used" in text and "model.prev.pt" in text
    else:
        ok = proc.returncode != 0 and str(ck / "model.pt") in text and "--allow-fresh-model" in text \
            and "Restore the checkpoint" in text and after == before
    said = [ln.split(" rank 0 ", 1)[-1][:400] for ln in text.splitlines() if re.search("checkpoint|not starting", ln)]
    return {"damage": damage.__name__, "previous_checkpoint": previous, "exit": proc.returncode,
            "files_untouched": after == before, "prev_kept": after.get("model.prev.pt") == before.get("model.prev.pt"),
            "message": (said or text.splitlines()[-3:])[:4], "ok": ok}


def damaged_checkpoint(tmp: Path, _pg, _scale) -> dict:
    from tests.runtime.test_checkpoints import DAMAGE

    cases = [worker_command(tmp / f"ck-{damage.__name__}-{prev}", damage, prev)
             for damage, _why in DAMAGE[:4] for prev in (False, True)]
    bad = [c for c in cases if not c["ok"]]
    refused = {c["exit"] for c in cases if not c["previous_checkpoint"]}
    return row(not bad, note=f"no readable checkpoint: refused with exit {sorted(refused)}, file and fix named, "
               f"nothing touched; newest damaged: resumed from model.prev.pt, kept; {len(cases) - len(bad)}/"
               f"{len(cases)} cases as expected" + (f"; failed: {bad}" if bad else ""), cases=cases)


# ------------------------------------------------------------------ 5. broker restarted empty
def broker_restarted_empty(tmp: Path, _pg, _scale) -> dict:
    from kale_airflow.core.slices import Slice
    from kale_airflow.runtime import worker as worker_module
    from kale_airflow.runtime.worker import Worker, _signalled
    from kale_airflow.stream import StreamPositionError
    from tests.stream.test_emptied_log import fill_kafka

    found = {}
    with contextlib.contextmanager(_broker)(tmp / "tansu-empty.log", grace_s=0.0) as broker:
        topic = broker.create_topic(1)
        s = KafkaStream.from_url(broker.url(topic))
        fill_kafka(s, 3000)
        w = Worker(s, "g", [Slice(0)], tmp / "ck-empty", batch_size=500)
        trained = w.run(exit_when_idle=True)["trained"]
        broker.restart_empty()
        t0 = time.time()
        broker.create_topic(1, name=topic)
        fill_kafka(KafkaStream.from_url(broker.url(topic)), 100)
        check_s, worker_module.POSITION_CHECK_S = worker_module.POSITION_CHECK_S, 0.2  # as the test does
        timer = threading.Timer(60.0, _signalled.append, (15,))  # never hang
        timer.start()
        try:
            w.run()
        except StreamPositionError as exc:
            found["on read"] = (str(exc), time.time() - t0)
        finally:
            timer.cancel()
            _signalled.clear()
            worker_module.POSITION_CHECK_S = check_s
        try:
            Worker(KafkaStream.from_url(broker.url(topic)), "g", [Slice(0)], tmp / "ck-empty")
        except StreamPositionError as exc:
            found["at start"] = (str(exc), None)
    named = {k: all(x in m for x in ("partition 0", "position 3000", "log end 100")) for k, (m, _) in found.items()}
    ok = len(found) == 2 and all(named.values())
    return row(ok, None, None, None, found.get("on read", (0, None))[1],
               ("; ".join(f"{k}: StreamPositionError: {m}" for k, (m, _) in found.items()) or "not detected")
               + "; time to recover: restart to the error on read",
               trained_before=trained, detected=sorted(found), names_partition_position_end=named)


# ------------------------------------------------------------------ 6. passwords masked
def password_masking(tmp: Path, pg, _scale) -> dict:
    from kale_airflow.cli.main import main
    from kale_airflow.control.autoscaler import Autoscaler
    from tests.test_no_password_leaks import served

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = database(pg).replace("postgres@", f"postgres:{PASSWORD}@")  # trust auth: any password is accepted
    d = PgDeployment(tmp / "masking", url, partitions=1, max_workers=1, batch=64, step_time_s=0.05)
    d.env.update(KALE_MLFLOW_URI=f"http://kale:{PASSWORD}@127.0.0.1:{closed.getsockname()[1]}",
                 MLFLOW_HTTP_REQUEST_MAX_RETRIES="0")
    handler, root = logging.FileHandler(d.home / "benchmark-python.log"), logging.getLogger()  # this process's log
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    out, texts = d.home / "benchmark-output.log", {}
    try:
        with captured(out), d.environment():
            producer = Producer(d.stream, 1, 200)
            producer.start()
            try:
                d.first_step(d.scale(1)["generation"])
                texts["rank command lines"] = " ".join(" ".join(psutil.Process(p).cmdline())
                                                       for p in d.slot_pids().values())
                Autoscaler.from_environment().poke(time.time())
                for argv in (["status", "--json"], ["status"], ["decide", "--dry-run"],
                             ["decide", "--dry-run", "--json"]):
                    main(argv)
                texts["ui /api/state"], texts["ui /"] = served("/api/state"), served("/")
            finally:
                producer.stop()
                stop_job(d)
            texts["decisions"] = json.dumps(d.store.decisions(), default=str)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
        closed.close()
    texts["this process's output"] = out.read_text(errors="replace")  # CLI output, this process's logs
    texts["postgres server log"] = pg.log.read_text(errors="replace")
    engine, meta = create_engine(url.replace("postgresql://", "postgresql+psycopg://")), MetaData()
    meta.reflect(engine)
    with engine.connect() as c:
        texts["database tables"] = " ".join(str(r) for t in meta.sorted_tables for r in c.execute(t.select()))
    engine.dispose()
    files = [p for p in d.home.rglob("*") if p.is_file()]
    leaks = [k for k, v in texts.items() if PASSWORD in v]
    leaks += [str(p.relative_to(d.home)) for p in files if PASSWORD.encode() in p.read_bytes()]
    shown = "***@" in texts["this process's output"] and "***@" in texts["ui /api/state"]
    return row(not leaks and shown, note=(f"password found in: {leaks}" if leaks else
               f"not in {len(files)} files, {len(meta.sorted_tables)} tables, CLI/UI output, logs, command lines")
               + ("" if shown else "; the masked URL (***@) was not shown: the fault was not exercised"),
               leaks=leaks, files_searched=len(files), tables_searched=len(meta.sorted_tables),
               masked_url_shown=shown)


# ------------------------------------------------------------------ driver
FAULTS = {"postgres-outage": postgres_outage, "kafka-outage": kafka_outage, "concurrent-apply": concurrent_apply,
          "damaged-checkpoint": damaged_checkpoint, "broker-restarted-empty": broker_restarted_empty,
          "password-masking": password_masking}


def run_fault(name: str, tmp: Path, pg, scale: float) -> dict:
    t0 = time.time()
    try:
        res = FAULTS[name](tmp, pg, scale)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pytest.fail in a fixture helper is a BaseException
        res = row(False, note=f"{type(exc).__name__}: {str(exc)[:1500]}")
    return {"fault": name, **res, "wall_s": time.time() - t0}


def fmt(v, spec="") -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "chaos.json"), help="result file")
    ap.add_argument("--outage-scale", type=float, default=1.0,
                    help="multiplies the 120 s PostgreSQL and 60 s broker outages (e.g. 0.1 for a quick check)")
    ap.add_argument("--only", default="", help="comma-separated fault numbers or names (default: all six)")
    args = ap.parse_args()
    chosen = [f for i, f in enumerate(FAULTS, 1) if not args.only or {str(i), f} & set(args.only.split(","))]
    load_before, t0, rows = os.getloadavg()[0], time.time(), []
    with tempfile.TemporaryDirectory(prefix="kale-chaos-") as t, postgres() as pg:
        for i, name in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {name} ...", flush=True)
            rows.append(run_fault(name, Path(t), pg, args.outage_scale))
            r = rows[-1]
            print(f"[{i}/{len(chosen)}] {name}: {'recovered' if r['recovered'] else 'NOT RECOVERED'} "
                  f"({r['wall_s']:.0f} s) {r['note'][:300]}", flush=True)
    print(f"\n{'fault':24} {'recovered':9} {'missing':>7} {'twice':>6} {'in ckpt':>7} {'recover s':>9}  note")
    for r in rows:
        print(f"{r['fault']:24} {r['recovered']!s:9} {fmt(r['missing']):>7} {fmt(r['trained_twice']):>6} "
              f"{fmt(r['twice_within_checkpoint']):>7} {fmt(r['recover_s'], '.1f'):>9}  {r['note'][:160]}")
    wall = time.time() - t0
    print(f"\nwall time {wall:.0f} s, outage scale {args.outage_scale:g}")
    write_json(args.json, {
        "machine": {"cpus": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()[0], "wall_s": wall},
        "settings": {"outage_scale": args.outage_scale, "postgres_outage_s": 120.0 * args.outage_scale,
                     "broker_outage_s": 60.0 * args.outage_scale, "checkpoint_every": EVERY, "faults": chosen},
        "all_recovered": all(r["recovered"] for r in rows), "faults": rows})
    return 0 if all(r["recovered"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
