#!/bin/bash
# Usage: docs/screenshot.sh [DEMO_OUT_DIR] [OUT.png]  (OUT.png: docs/kale-page.png by default; needs Debian chromium)
# Serves the real Airflow API server (with the Kale plugin) and screenshots /kale/ in headless
# Chromium. Given a demo run's directory (`kale demo --out DIR`), on that run's state.
# Without one, on a built control plane, which is what docs/kale-page.png shows: not a live
# run, but Kale as the autoscaler builds it (build_kale, from the kale.yaml below) replayed by the
# simulator's protocol over 12 hours of the bundled NYC taxi trace (20:00 to 08:00, 4 % noise
# on the arrivals, the autoscaler paused 01:00-01:30), every decision written through
# StateStore.record_decision with what Autoscaler.poke records beside it, the times moved by
# whole days into the last day; both models are registered and reviewed in the embedded
# MLflow as the pipelines do (the first version of each, so promoted).
# All-admins mode is a development setting: it stands in for a logged-in user here.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 2 ]; then H=$1; OUT=$2; else H=$(mktemp -d); OUT=${1:-$ROOT/docs/kale-page.png}; BUILD=1; fi
PORT=18080
export AIRFLOW_HOME=$H/airflow KALE_HOME=$H/kale AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$H/airflow/airflow.db
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
if [ -n "$BUILD" ]; then
  mkdir -p "$AIRFLOW_HOME"
  "$ROOT/.venv/bin/airflow" db migrate > "$H/migrate.log" 2>&1
  "$ROOT/.venv/bin/python" - > "$H/build.log" 2>&1 <<'PY'
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from kale_airflow.config import load_config, settings
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import Decision, Reason, build_kale
from kale_airflow.core.simulator import SimConfig, build_workload, profile_observations, run_policy
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
from kale_airflow.store import StateStore

env = settings()
env.home.mkdir(parents=True, exist_ok=True)
(env.home / "kale.yaml").write_text(yaml.safe_dump({
    "min_workers": 1, "max_workers": 16, "partitions": 16, "slo_s": 300, "poll_interval_s": 15,
    "rescale_downtime_s": 90, "bin_s": 300, "kale": {"forecast_quantile": 0.8}}))
dep = load_config().deployment
sim = SimConfig(tick_s=dep.poll_interval_s, ref_workers=12, max_workers=dep.max_workers, partitions=dep.partitions,
                rescale_downtime_s=dep.rescale_downtime_s, slo_s=dep.slo_s, history_days=14 + 20 / 24, days=0.5,
                profile_workers=(1, 2, 4, 8, 16))
workload = build_workload(load_trace(BUNDLED_TRACE), sim)  # 20:00 to 08:00 after 14 days of history
rng = np.random.default_rng(sim.seed)
workload.arrivals = workload.arrivals * np.maximum(0.0, 1 + 0.04 * rng.standard_normal(len(workload.arrivals)))
shift = (time.time() - workload.start_s - 43200) // 86400 * 86400  # whole days: the same clock, within the last day
pause = (workload.start_s + 5 * 3600, workload.start_s + 5.5 * 3600)  # the autoscaler DAG paused 01:00-01:30
profile = profile_observations(sim)
kale = build_kale(dep.limits, get_forecaster("seasonal"), profile, dep.kale_config, bin_s=dep.bin_s,
                  history=workload.history)
store = StateStore(env.database_url)


class Recorded:
    """The policy, each decision recorded with what Autoscaler.poke records beside it."""

    name, interval_s = "kale", kale.interval_s

    def decide(self, obs):
        if pause[0] <= obs.now_s < pause[1]:
            return Decision(obs.workers, Reason.HOLD, "paused")  # nothing decided, nothing recorded
        d = kale.decide(obs)
        table = kale.capacity.table
        cap = None if table is None else float(table[min(obs.workers, len(table) - 1)])
        kcap = None if table is None else float(table[min(d.workers, len(table) - 1)])
        store.record_decision(obs.now_s + shift, obs.workers, d.to_dict() | {
            "arrival_rate": obs.arrival_rate, "backlog": obs.backlog, "freshness_lag_s": obs.freshness_lag_s,
            "capacity": cap, "kale_capacity": kcap, "ready_workers": obs.ready_workers, "throughput": obs.throughput})
        return d


def register_champions() -> None:
    """The forecaster and throughput model registered and reviewed as the pipelines do (the
    first version of each: no champion yet, so promoted)."""
    import mlflow

    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry import mlflow_registry as reg
    from kale_airflow.registry.pyfunc import ForecasterModel, ThroughputModelPyfunc

    tmp = Path(tempfile.mkdtemp())
    save_forecaster(get_forecaster("seasonal").fit(workload.history), tmp / "forecaster")
    (tmp / "throughput.json").write_text(json.dumps(ThroughputModel.fit(*profile).to_dict()))
    for name, model, artifacts in ((reg.FORECASTER_MODEL, ForecasterModel(), {"forecaster": str(tmp / "forecaster")}),
                                   (reg.THROUGHPUT_MODEL, ThroughputModelPyfunc(),
                                    {"throughput": str(tmp / "throughput.json")})):
        with reg.mlflow_at(env.mlflow_uri, env.artifacts.as_uri()) as client:
            with mlflow.start_run():
                logged = mlflow.pyfunc.log_model(name="model", python_model=model, artifacts=artifacts,
                                                 pip_requirements=["pandas"])
            client.create_registered_model(name)
            version = str(mlflow.register_model(logged.model_uri, name).version)
            client.set_registered_model_alias(name, reg.CHALLENGER, version)
            reg.review(client, name, version, 1.0, None, "mase", True, {})


noise = np.maximum(0.5, 1 + sim.cluster.noise_sd * rng.standard_normal(len(workload.arrivals)))
initial = sim.limits.clamp(sim.cluster.workers_for(workload.arrivals[0] / sim.tick_s * 1.2, sim.max_workers))
run = run_policy(Recorded(), workload, sim, noise, initial)
store.set_current_generation(f"g{len(run.rescale_events) + 1}", int(run.workers[-1]))
register_champions()
print(f"{len(store.decisions(100000))} decisions recorded, {len(run.rescale_events)} rescales")
PY
  echo "built control plane in $KALE_HOME: $(tail -1 "$H/build.log")"
fi
"$ROOT/.venv/bin/airflow" api-server --port $PORT > "$H/apiserver.log" 2>&1 &
PID=$!
for i in $(seq 120); do curl -s -o /dev/null http://127.0.0.1:$PORT/api/v2/version && break; sleep 1; done
echo "anonymous /kale/api/state: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/kale/api/state)"
PROFILE=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$PROFILE" --window-size=1300,1700 \
  --virtual-time-budget=15000 --screenshot="$OUT" "http://127.0.0.1:$PORT/kale/" 2>/dev/null || true
kill $PID
rm -rf "$PROFILE"
