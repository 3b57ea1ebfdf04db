"""Runtime benchmark (issues 5, 13): embedded stream throughput with several processes, the
training job's samples/s at world sizes 1, 2 and 3 (one torch.distributed job, gloo over
loopback, DDP all-reduce every step, no step-time emulation) with the throughput model
fitted to those real observations, and checkpoint + restore time.

    .venv/bin/python benchmarks/runtime.py [--json OUT] [--seconds 20]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kale_airflow.core.slices import Slice
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.reporting.results import write_json
from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker
from kale_airflow.stream.embedded import EmbeddedStream

ROOT = Path(__file__).resolve().parent.parent


def _append(path, partition, batches, payloads, q):
    s = EmbeddedStream(path)
    t0 = time.perf_counter()
    for _ in range(batches):
        s.append(partition, payloads)
    q.put(time.perf_counter() - t0)


def _read(path, partition, q):
    s = EmbeddedStream(path)
    t0 = time.perf_counter()
    off = n = 0
    while True:
        recs = s.read(partition, off, 5000)
        if not recs:
            break
        off = recs[-1].offset + 1
        n += len(recs)
    q.put((n, time.perf_counter() - t0))


def stream_speed(tmp: Path, procs: int = 4, batches: int = 50, batch: int = 500) -> dict:
    path = tmp / "bench-stream.db"
    EmbeddedStream(path, partitions=procs)
    payloads = pack(generate(batch, 0))
    q = mp.Queue()
    ps = [mp.Process(target=_append, args=(path, i, batches, payloads, q)) for i in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    append_wall = time.perf_counter() - t0
    total = procs * batches * batch
    ps = [mp.Process(target=_read, args=(path, i, q)) for i in range(procs)]
    while not q.empty():
        q.get()
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    read_wall = time.perf_counter() - t0
    read = sum(q.get()[0] for _ in range(procs))
    res = {"processes": procs, "samples": total, "append_per_s": total / append_wall, "read_per_s": read / read_wall}
    print(f"embedded stream, {procs} processes: append {res['append_per_s']:,.0f} samples/s, read "
          f"{res['read_per_s']:,.0f} samples/s (targets >= 20,000)", flush=True)
    return res


def worker_scaling(tmp: Path, seconds: float) -> dict:
    # One core per rank (as one device per rank on a GPU node); a 3rd rank oversubscribes 2 cores.
    os.environ.setdefault("KALE_WORKER_THREADS", "1")
    load_before = os.getloadavg()[0]
    rows = {}
    for n in (1, 2, 3):
        d = tmp / f"w{n}"
        stream = EmbeddedStream(d / "s.db", partitions=6)
        for p in range(6):
            for chunk in range(250):
                stream.append(p, pack(generate(1000, 1000 * p + chunk)))
        metrics = EmbeddedMetrics(f"sqlite:///{d / 'kale.db'}")
        from kale_airflow.core.rebalance import assign

        doc = assign({str(p): 1.0 for p in range(6)}, n).to_dict()
        spec = WorkerSpec(f"sqlite:///{d / 's.db'}", str(d / "ck"), database_url=f"sqlite:///{d / 'kale.db'}",
                          batch_size=512, extra_args=["--report-every", "1"])
        workers = LocalWorkers(spec, d / "logs")
        workers.start("bench", doc)
        deadline = time.monotonic() + 180  # torch import and rendezvous first: time the job once it runs
        while metrics.throughput_observations().empty and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(seconds)
        workers.stop()
        obs = metrics.throughput_observations()
        rates = obs["rate"].to_numpy()
        rows[n] = rates
        print(f"training job, world size {n} (gloo, 127.0.0.1): {np.median(rates):,.0f} samples/s "
              f"({len(rates)} observations by rank 0)", flush=True)
    workers_col = np.concatenate([[n] * len(r) for n, r in rows.items()])
    rates_col = np.concatenate(list(rows.values()))
    model = ThroughputModel.fit(workers_col, rates_col)
    fitted = {n: float(model.predict(n)[0]) for n in (1, 2, 3, 4)}
    print(f"throughput model fitted to them: {', '.join(f'{n}: {v:,.0f}' for n, v in fitted.items())} samples/s; "
          f"saturation at {model.saturation_workers(8)} rank(s) on this {os.cpu_count()}-CPU machine", flush=True)
    return {"what": "one torch.distributed job (gloo, DDP) per world size on this machine's CPUs, real steps "
                    "(no --step-time emulation); samples/s of the whole job measured by rank 0",
            "batch_per_rank": 512, "cpus": os.cpu_count(), "threads_per_rank": int(os.environ["KALE_WORKER_THREADS"]),
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
            "median_samples_per_s": {n: float(np.median(r)) for n, r in rows.items()},
            "observations": {n: len(r) for n, r in rows.items()}, "model": model.to_dict(), "fitted": fitted,
            "saturation_workers": model.saturation_workers(8)}


def checkpoint_speed(tmp: Path) -> dict:
    stream = EmbeddedStream(tmp / "ck.db", partitions=1)
    stream.append(0, pack(generate(2000, 0)))
    w = Worker(stream, "g", [Slice(0)], tmp / "ckpt")
    w.run(max_steps=2)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        w.checkpoint()
        Worker(stream, "g", [Slice(0)], tmp / "ckpt")
        times.append(time.perf_counter() - t0)
    size = (tmp / "ckpt" / "model.pt").stat().st_size
    res = {"seconds_median": float(np.median(times)), "bytes": size, "pass": float(np.median(times)) <= 2.0}
    print(f"checkpoint + restore of the reference model ({size / 1e6:.1f} MB): {res['seconds_median'] * 1e3:.0f} ms "
          f"(target <= 2 s)", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "runtime.json"))
    ap.add_argument("--seconds", type=float, default=10.0, help="run time per worker count")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        report = {"stream": stream_speed(tmp), "workers": worker_scaling(tmp, args.seconds),
                  "checkpoint": checkpoint_speed(tmp)}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
