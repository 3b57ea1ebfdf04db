"""The Kale page: anonymous requests are refused by Airflow's auth, users without read access
to the kale_autoscaler DAG by Airflow's auth manager (403); with both it renders decisions,
models and the plot from a recorded autoscaler history. (Masking: tests/test_no_password_leaks.py.)"""

import time

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from kale_airflow.store import StateStore
from kale_airflow.ui.app import app, can_read_kale, create_app
from kale_airflow.ui.plugin import KalePlugin


@pytest.fixture
def history(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_MLFLOW_URI", f"sqlite:///{tmp_path}/mlflow.db")
    store = StateStore(tmp_path / "kale.db")
    now = time.time()
    for i, (w, t, reason) in enumerate([(2, 2, "hold"), (2, 5, "scale_up_forecast"), (5, 5, "hold"),
                                        (5, 3, "scale_down_forecast")]):
        store.record_decision(now - 60 * (4 - i), w, {"workers": t, "reason": reason, "message": f"because {i}",
                                                      "arrival_rate": 1000.0 * t, "forecast_upper": 1100.0 * t,
                                                      "need": t, "capacity": 1050.0 * w})
    store.set_current_generation("g7", 3)
    return store


@pytest.mark.parametrize("make", [lambda: app, create_app], ids=["plugin-app", "fresh-app"])
def test_every_route_refuses_anonymous_requests(history, make):
    """Bug class: a route served without Airflow's auth (the app-level dependency dropped or
    replaced). The plugin's app, and one built again (so `make mutation` sees the factory)."""
    paths = sorted(r.path for r in make().routes)
    assert paths == ["/", "/api/state", "/plot.png"]  # a new route must be added here, and is then checked
    client = TestClient(make())
    assert {p: client.get(p).status_code for p in paths} == {p: 401 for p in paths}


@pytest.mark.parametrize("make", [lambda: app, create_app], ids=["plugin-app", "fresh-app"])
@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_documentation_routes_are_off(history, path, make):
    """Bug class: FastAPI's documentation routes (not covered by app-level dependencies)
    answering anonymous requests."""
    assert TestClient(make()).get(path).status_code == 404


REAL_SERVER = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
PATHS = ["/kale/", "/kale/api/state", "/kale/plot.png"]
client = TestClient(create_app())
manager = get_auth_manager()
token, viewer, nobody = (manager.generate_jwt(SimpleAuthManagerUser(username=u, role=r))
                         for u, r in (("admin", "admin"), ("vera", "viewer"), ("nora", None)))
asked = []
is_authorized_dag = manager.is_authorized_dag
manager.is_authorized_dag = lambda **kw: asked.append((kw["method"], kw["details"].id)) or is_authorized_dag(**kw)
out = {
    "anonymous": client.get("/kale/api/state").status_code,
    "bad_token": client.get("/kale/api/state", headers={"Authorization": "Bearer forged"}).status_code,
    "header": client.get("/kale/api/state", headers={"Authorization": f"Bearer {token}"}).status_code,
    "cookie_page": client.get("/kale/", cookies={"_token": token}).text,
    "viewer": {p: client.get(p, headers={"Authorization": f"Bearer {viewer}"}).status_code for p in PATHS},
    "no_role": {p: client.get(p, headers={"Authorization": f"Bearer {nobody}"}).status_code for p in PATHS},
    "no_role_page": client.get("/kale/", cookies={"_token": nobody}).text,
    "asked": sorted(set(asked)),
}
print("KALE_UI" + json.dumps(out))
"""


@pytest.mark.slow
def test_served_by_the_real_airflow_api_server_with_its_auth(airflow_home, tmp_path):
    """The provider plugin is mounted by Airflow's own app factory, and Airflow's JWTs
    (header or the UI's cookie) open it; anonymous and forged requests do not. Its
    SimpleAuthManager is asked for GET on kale_autoscaler: a viewer reads every route, a
    user without a role gets 403 on every route."""
    import json
    import subprocess
    import sys

    env = airflow_home.env | {"KALE_HOME": str(tmp_path / "kale")}
    StateStore(tmp_path / "kale" / "kale.db").record_decision(time.time(), 2, {
        "workers": 4, "reason": "scale_up_forecast", "message": "traffic doubles within the hour"})
    out = subprocess.run([sys.executable, "-c", REAL_SERVER], env=env, capture_output=True, text=True, timeout=300)
    line = next((l for l in out.stdout.splitlines() if l.startswith("KALE_UI")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[len("KALE_UI"):])
    assert res["anonymous"] == 401 and res["bad_token"] in (401, 403) and res["header"] == 200
    assert "traffic doubles within the hour" in res["cookie_page"]
    assert set(res["viewer"].values()) == {200} and set(res["no_role"].values()) == {403}
    assert "traffic doubles" not in res["no_role_page"]
    assert res["asked"] == [["GET", "kale_autoscaler"]]


@pytest.fixture(params=["plugin-app", "fresh-app"])
def signed_in(request):
    served = app if request.param == "plugin-app" else create_app()
    served.dependency_overrides[get_user] = lambda: object()  # stands in for a logged-in Airflow user
    served.dependency_overrides[can_read_kale] = lambda: None  # ... allowed to read kale_autoscaler
    yield TestClient(served)
    served.dependency_overrides.clear()


class PerDagAuthManager:
    """An auth manager whose users may read only the DAGs named in their role (``"dag_a,dag_b"``),
    as FAB's per-DAG permissions or Keycloak's policies would grant; it records what it was asked."""

    def __init__(self):
        self.asked = []

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        self.asked.append((method, access_entity, details.id if details else None))
        return method == "GET" and details is not None and details.id in (user.role or "").split(",")


def _simple_auth_manager():
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    return SimpleAuthManager()


@pytest.mark.parametrize("manager, role, allowed", [
    (_simple_auth_manager, "viewer", True),
    (_simple_auth_manager, "admin", True),
    (_simple_auth_manager, None, False),
    (PerDagAuthManager, "kale_autoscaler", True),
    (PerDagAuthManager, "kale_training,kale_forecaster_retrain", False),
], ids=["simple-viewer", "simple-admin", "simple-no-role", "per-dag-autoscaler", "per-dag-other-dags"])
def test_every_route_needs_read_access_to_the_autoscaler_dag(history, monkeypatch, manager, role, allowed):
    """Bug class: a logged-in user without the permission reads the page (any role sees
    everything), or the check asks about another DAG. The real SimpleAuthManager, and one
    that grants DAGs one by one; Airflow's metadata database (the DAG's team) is not needed."""
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api import security
    from airflow.models.dag import DagModel

    auth = manager()
    monkeypatch.setattr(security, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, session=None: None))
    served = create_app()
    served.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="u", role=role)
    client = TestClient(served)
    codes = {p: client.get(p).status_code for p in ("/", "/api/state", "/plot.png")}
    assert codes == dict.fromkeys(codes, 200 if allowed else 403)
    if not allowed:
        assert "because 3" not in client.get("/").text and client.get("/api/state").json() == {"detail": "Forbidden"}
    if isinstance(auth, PerDagAuthManager):
        assert set(auth.asked) == {("GET", None, "kale_autoscaler")}


def test_page_shows_decisions_models_and_plot(history, signed_in):
    page = signed_in.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "scale_down_forecast" in page.text and "because 3" in page.text and "g7" in page.text
    png = signed_in.get("/plot.png")
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    state = signed_in.get("/api/state").json()
    assert [d["target"] for d in state["decisions"]] == [2, 5, 5, 3]
    assert [d["capacity"] for d in state["decisions"]] == [2100.0, 2100.0, 5250.0, 5250.0]
    assert state["current"]["generation"] == "g7"


def test_plugin_registers_the_app_and_a_nav_entry():
    assert KalePlugin.fastapi_apps[0]["url_prefix"] == "/kale"
    assert KalePlugin.external_views[0]["destination"] == "nav"
    from kale_airflow.get_provider_info import get_provider_info

    assert get_provider_info()["plugins"][0]["plugin-class"] == "kale_airflow.ui.plugin.KalePlugin"


@pytest.mark.parametrize("yaml_text, expected", [
    ("slo_s: 120\npoll_interval_s: 30\nkale: {forecast_quantile: 0.9}\n", (120.0, 0.9, 2881)),
    (None, (300.0, 0.5, 5761)),  # no kale.yaml: the embedded defaults, a 15 s poll interval
    ("slo_s: [not, a, number]\n", (None, None, 2000)),  # unreadable: still a figure, without the SLO
], ids=["deployment", "defaults", "bad-config"])
def test_the_plot_shows_the_last_day_against_the_deployments_slo(history, signed_in, monkeypatch, tmp_path,
                                                                 yaml_text, expected):
    from kale_airflow.reporting import plots

    if yaml_text is not None:
        (tmp_path / "kale.yaml").write_text(yaml_text)
    seen, limits = [], []
    draw, read = plots.plot_decisions, StateStore.decisions
    monkeypatch.setattr(plots, "plot_decisions", lambda ds, slo_s, quantile: seen.append((slo_s, quantile, ds))
                        or draw(ds, slo_s, quantile))
    monkeypatch.setattr(StateStore, "decisions", lambda self, limit=1000: limits.append(limit) or read(self, limit))
    png = signed_in.get("/plot.png")
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    (slo_s, quantile, ds), = seen
    assert (slo_s, quantile, limits[-1]) == expected and [d["reason"] for d in ds][-1] == "scale_down_forecast"


def test_a_fleet_page_shows_every_job_and_each_job_needs_its_own_dag_permission(tmp_path, monkeypatch):
    """Bug classes: one job's page readable with another job's permission, the overview
    showing a job the user may not read, a job's rows shown on another's page, an unknown job
    answered with the default job's page."""
    import json

    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api import security
    from airflow.models.dag import DagModel

    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_MLFLOW_URI", f"sqlite:///{tmp_path}/mlflow.db")
    (tmp_path / "kale.yaml").write_text(json.dumps({"fleet": {"gpus": 6}, "jobs": [
        {"name": "ranking", "stream_url": "sqlite:///r.db", "priority": 3},
        {"name": "ads", "stream_url": "sqlite:///a.db"}]}))
    now = time.time()
    for job, workers, reason, message in (("ranking", 4, "hold", "ranking keeps 4"),
                                          ("ads", 2, "hold_budget", "ads gets 2 of the 4 workers it asks for")):
        store = StateStore(f"sqlite:///{tmp_path / 'kale.db'}", job)
        store.set_current_generation(f"g000001-{workers}w", workers)
        store.record_decision(now, workers, {"workers": workers, "reason": reason, "message": message,
                                             "plan_workers": 4, "freshness_lag_s": 30.0})
    from kale_airflow.control.fleet import pin

    pin(StateStore(f"sqlite:///{tmp_path / 'kale.db'}", "ads"), 3, now + 3600, "load test")
    auth = PerDagAuthManager()
    monkeypatch.setattr(security, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, session=None: None))

    def client(role):
        served = create_app()
        served.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="u", role=role)
        return TestClient(served)

    both = client("kale_autoscaler__ranking,kale_autoscaler__ads")
    overview = both.get("/")
    assert overview.status_code == 200 and "Kale fleet" in overview.text
    assert "ranking keeps 4" in overview.text and "ads gets 2 of the 4" in overview.text
    rows = {r["job"]: r for r in both.get("/api/state").json()["fleet"]}
    assert rows["ads"]["held_by_budget"] and not rows["ranking"]["held_by_budget"]
    assert (rows["ads"]["workers"], rows["ads"]["asks"], rows["ads"]["slo_ok"]) == (2, 4, True)
    assert rows["ads"]["pin"]["workers"] == 3 and rows["ranking"]["pin"] is None
    assert "pinned to 3 until" in overview.text and "(load test)" in overview.text
    ads_page = both.get("/?job=ads")
    assert ads_page.status_code == 200 and "ads gets 2" in ads_page.text and "ranking keeps" not in ads_page.text
    assert "pinned to 3 until" in ads_page.text and "pinned" not in both.get("/?job=ranking").text
    assert both.get("/plot.png?job=ranking").content[:4] == b"\x89PNG" and both.get("/plot.png").status_code == 400
    unknown = both.get("/?job=feed")
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == "no job 'feed' in this deployment; its jobs: ranking, ads"

    only_ads = client("kale_autoscaler__ads")
    assert {p: only_ads.get(p).status_code for p in ("/?job=ads", "/?job=ranking", "/", "/api/state")} == {
        "/?job=ads": 200, "/?job=ranking": 403, "/": 403, "/api/state": 403}
