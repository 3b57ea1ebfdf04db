"""The Kale page in a real headless browser (Debian chromium), served by `airflow api-server`."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from kale_airflow.store import StateStore

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dom(url: str) -> str:
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tempfile.mkdtemp()}", "--virtual-time-budget=5000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    return out.stdout


def serve(airflow_home, env_extra):
    port = free_port()
    env = airflow_home.env | env_extra
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:  # ready when its health endpoint answers, not when the port opens
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(1)
    proc.kill()
    raise AssertionError("airflow api-server did not start")


@pytest.fixture
def recorded(airflow_home):
    store = StateStore(airflow_home.kale_home / "kale.db")
    store.record_decision(time.time() - 30, 2, {"workers": 5, "reason": "scale_up_forecast",
                                                "message": "forecast needs 5 workers within 60 min",
                                                "arrival_rate": 900.0, "forecast_upper": 1200.0, "need": 5})
    store.set_current_generation("g42", 5)
    return airflow_home


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian chromium (.ci/run installs it)")
def test_unauthenticated_browser_is_refused_and_a_user_sees_the_page(recorded):
    proc, port = serve(recorded, {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False"})
    try:
        refused = dom(f"http://127.0.0.1:{port}/kale/")
        assert "Not authenticated" in refused and "Kale autoscaler" not in refused
    finally:
        proc.kill()
    # All-admins mode logs every browser in as an admin (a development setting): the page renders.
    proc, port = serve(recorded, {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"})
    try:
        page = dom(f"http://127.0.0.1:{port}/kale/")
        assert "Kale autoscaler" in page and "g42" in page and "forecast needs 5 workers" in page
        assert '<img src="plot.png"' in page
    finally:
        proc.kill()
