"""A real Prometheus server (Debian's ``prometheus`` package) for tests, and the local
processes it scrapes.

- :func:`prometheus_binary` finds ``prometheus``/``promtool`` on PATH, else fails the test
  (``.ci/run`` installs the package; these tests must run, never skip);
- :class:`PrometheusServer` starts ``prometheus`` on a free port with a 1 s scrape interval
  over the given targets, waits until every target is up, and stops it by its PID;
- run as a script, this module is one of the scraped processes::

      python -m tests.prometheus_harness worker PORT WORKER WORKERS SAMPLES STEP_S [JOB]
      python -m tests.prometheus_harness kafka PORT TOPIC RATE[,RATE...]

  ``worker`` trains nothing but goes through ``kale_airflow.runtime.exposition`` exactly as a
  worker does (``serve`` once, ``observe_step`` after each step of ``SAMPLES`` in ``STEP_S``);
  ``kafka`` serves a Kafka exporter's ``kafka_topic_partition_current_offset`` series,
  partition p's log-end offset growing at ``RATE[p]`` samples/s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def prometheus_binary(name: str = "prometheus") -> str:
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: the Prometheus tests run against a real server; install Debian's "
                    "prometheus package (apt-get install prometheus), as .ci/run does", pytrace=False)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - not there yet
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} (last error: {last})")


def start_process(*args: str, port: int) -> subprocess.Popen:
    """One scraped process (this module as a script); returns once its /metrics answers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.prometheus_harness", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: proc.poll() is None and get(f"http://127.0.0.1:{port}/metrics"), 30,
                 f"{args[0]} on port {port}")
    except TimeoutError:
        stop_process(proc)
        raise AssertionError(f"{args} did not serve /metrics: {proc.stderr.read().decode()[-2000:]}") from None
    return proc


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


class PrometheusServer:
    """``prometheus`` on 127.0.0.1:PORT scraping ``jobs`` ({job: [host:port, ...]}) every second."""

    def __init__(self, jobs: dict[str, list[str]]):
        self.jobs = jobs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="kale-prom-"))
        self.proc: subprocess.Popen | None = None

    def config(self) -> str:
        lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s", "scrape_configs:"]
        for job, targets in self.jobs.items():
            lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: {json.dumps(targets)}"]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(self.config())
        check = subprocess.run([prometheus_binary("promtool"), "check", "config", str(cfg)], capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = (self.dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen([prometheus_binary(), f"--config.file={cfg}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: self.proc.poll() is None and get(f"{self.url}/-/ready"), timeout, "Prometheus ready")
            self.wait_targets_up(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def targets(self) -> list[dict]:
        return json.loads(get(f"{self.url}/api/v1/targets"))["data"]["activeTargets"]

    def wait_targets_up(self, timeout: float = 60.0) -> None:
        want = sum(len(t) for t in self.jobs.values())
        wait_for(lambda: len(t := self.targets()) == want and all(x["health"] == "up" for x in t), timeout,
                 f"{want} target(s) up")

    def query(self, promql: str) -> list[dict]:
        from urllib.parse import urlencode

        body = json.loads(get(f"{self.url}/api/v1/query?{urlencode({'query': promql})}"))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ------------------------------------------------------------------ scraped processes
def _run_worker(port: int, worker: int, workers: int, samples: int, step_s: float, job: str = "default") -> None:
    from kale_airflow.runtime import exposition

    exposition.serve(port, addr="127.0.0.1", worker=worker, generation="g1", workers=workers, restored=True, job=job)
    lag = 1000.0
    while True:
        t0 = time.perf_counter()
        time.sleep(step_s)
        lag = max(0.0, lag - samples / 10)
        exposition.observe_step(samples, time.perf_counter() - t0, lag={f"{worker}/0": lag}, malformed=1)


def _run_kafka(port: int, topic: str, rates: list[float]) -> None:
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry()
    offset = Gauge("kafka_topic_partition_current_offset", "Log-end offset of a partition.",
                   ["topic", "partition"], registry=registry)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    t0 = time.time()
    while True:
        for p, r in enumerate(rates):
            offset.labels(topic, str(p)).set(int(r * (time.time() - t0)))
        time.sleep(0.1)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    kind, args = sys.argv[1], sys.argv[2:]
    if kind == "worker":
        _run_worker(int(args[0]), int(args[1]), int(args[2]), int(args[3]), float(args[4]), *args[5:])
    elif kind == "kafka":
        _run_kafka(int(args[0]), args[1], [float(x) for x in args[2].split(",")])
    else:
        sys.exit(f"unknown process kind {kind!r}")
