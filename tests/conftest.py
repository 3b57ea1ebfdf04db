"""Shared fixtures: small synthetic traces built in memory (no network, no shared files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import settings

# No per-example deadline: it is a wall-clock assertion, and on a loaded 2-core machine a
# 0.02 ms example once took 600 ms (speed targets live in benchmarks/, not in tests).
settings.register_profile("kale", deadline=None)
settings.load_profile("kale")


def daily_series(days: int = 21, step_s: int = 300, base: float = 100.0, amp: float = 60.0, noise: float = 0.0,
                 seed: int = 0, start: str = "2024-01-01") -> pd.Series:
    """A regular series with a daily sine pattern (optionally noisy)."""
    n = int(days * 86400 / step_s)
    t = np.arange(n) * step_s
    y = base + amp * np.sin(2 * np.pi * t / 86400)
    if noise:
        y = y * (1 + noise * np.random.default_rng(seed).standard_normal(n))
    idx = pd.date_range(start, periods=n, freq=pd.Timedelta(seconds=step_s))
    return pd.Series(np.maximum(y, 0.0), index=idx, name="value")


def assert_next_bins_forecast(out: pd.DataFrame, s: pd.Series, max_mae: float) -> None:
    """A forecaster fitted on ``s.iloc[:-8]`` predicted its next 4 bins: quantile columns in
    order, dated from the bin after the history, non-negative, and within ``max_mae`` of the
    actual values (well under the daily pattern's amplitude of 60: it learned the shape)."""
    assert list(out.columns) == ["mean", "q50", "q80", "q90"]
    assert out.index[0] == s.index[-9] + (s.index[1] - s.index[0])
    assert (out["q50"] <= out["q80"]).all() and (out["q80"] <= out["q90"]).all()
    assert (out.to_numpy() >= 0).all()
    assert np.abs(out["mean"].to_numpy() - s.iloc[-8:-4].to_numpy()).mean() < max_mae


@pytest.fixture
def daily():
    return daily_series()


@pytest.fixture(scope="session")
def airflow_template(tmp_path_factory):
    from tests.airflow_harness import migrated_template

    return migrated_template(tmp_path_factory.mktemp("airflow"))


@pytest.fixture
def airflow_home(airflow_template, tmp_path):
    from tests.airflow_harness import fresh_home

    home = fresh_home(airflow_template, tmp_path / "home")
    yield home
    home.close()


# ------------------------------------------------------------------ PostgreSQL
def _postgres_bin(name: str) -> str:
    """A PostgreSQL server binary: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    import glob
    import shutil

    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if versions:
        return versions[-1]
    pytest.fail(f"PostgreSQL's {name} is not installed: the control-plane store is tested against a real server; "
                "install Debian's postgresql package (apt-get install postgresql) or put initdb and pg_ctl on PATH",
                pytrace=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """The session's PostgreSQL server: its URL, and ``stop()``/``start()`` (pg_ctl) for tests
    of what an outage does; a test that stops it starts it again before it ends."""

    def __init__(self, run, pg_ctl: str, data: Path, log: Path, options: str, url: str):
        self._run, self.pg_ctl, self.data, self.log, self.options, self.url = run, pg_ctl, data, log, options, url

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: connections are cut, new ones refused, until :meth:`start`."""
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")

    def start(self) -> None:
        """``pg_ctl start`` on the same port and data folder; returns once it accepts connections."""
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-o", self.options, "start")


@pytest.fixture(scope="session")
def postgres_url(postgres_server):
    """The session's PostgreSQL server: ``postgresql://postgres@127.0.0.1:PORT/kale``."""
    return postgres_server.url


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the session (a :class:`PostgresServer`).

    initdb refuses to run as root, so as root the server runs as the ``postgres`` user (or
    ``nobody``) in a folder it owns; the folder lives under /tmp because pytest's own tmp
    folders are private to the user running pytest."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    root = Path(tempfile.mkdtemp(prefix="kale-pg-"))
    data, log = root / "data", root / "server.log"
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = "postgres"
        try:
            pwd.getpwnam(user)
        except KeyError:
            user = "nobody"
        os.chmod(root, 0o755)
        shutil.chown(root, user)
        prefix = ["runuser", "-u", user, "--"]
    port = _free_port()

    def run(*cmd):
        proc = subprocess.run([*prefix, *cmd], capture_output=True, text=True, check=False)
        if proc.returncode:
            server_log = log.read_text() if log.exists() else ""
            pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}\n{server_log}", pytrace=False)

    run(initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
    server = PostgresServer(run, pg_ctl, data, log, f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
                            "-c max_connections=300 -c fsync=off", f"postgresql://postgres@127.0.0.1:{port}/kale")
    server.start()
    try:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE kale")
        yield server
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_database(postgres_url):
    """A new, empty database on the session's server for one test (tests never see each other's rows)."""
    import uuid

    import psycopg

    name = f"kale_{uuid.uuid4().hex[:12]}"
    admin = postgres_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    from kale_airflow.store.database import forget_databases

    forget_databases()  # close the pooled connections, or the server runs out of them
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """The control-plane database URL, once per backend: a SQLite file and a PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kale.db'}"
        from kale_airflow.store.database import forget_databases

        forget_databases()
    else:
        yield request.getfixturevalue("postgres_database")


def seed_simulated_throughput(url, ts: float = 1.0, job: str = "default") -> int:
    """Write the simulator's profiling run of its reference cluster as job ``job``'s throughput
    observations (at ``ts``: the refit ignores rows at timestamp 0, the seed of earlier
    versions) into the control plane at ``url``, for tests whose subject is not how
    observations were measured. Only tests write simulated rows; no component does. Returns
    the rows written."""
    from kale_airflow.core.simulator import SimConfig, profile_observations
    from kale_airflow.metrics.embedded import EmbeddedMetrics

    n, r = profile_observations(SimConfig())
    return EmbeddedMetrics(url, job).write_throughput(np.full(len(n), float(ts)), n, r)


def wait_until(condition, what: str, timeout: float = 180.0) -> None:
    """Poll until ``condition()`` holds (a loaded CI machine may take seconds to start torch)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s")


def audit_coverage(path) -> dict[int, dict[int, int]]:
    """offset -> times trained, per partition, from a worker audit log and the slice masks."""
    from pathlib import Path

    from kale_airflow.core.slices import Slice

    seen: dict[int, dict[int, int]] = {}
    for line in Path(path).read_text().splitlines():
        p, lo, hi, a, b = line.strip().split(",")[:5]
        sl = Slice(int(p), float(lo), float(hi))
        offs = np.arange(int(a), int(b))
        for o in offs[sl.mask(offs)]:
            seen.setdefault(int(p), {}).setdefault(int(o), 0)
            seen[int(p)][int(o)] += 1
    return seen
