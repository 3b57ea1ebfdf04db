#!/bin/bash
# Usage: docs/screenshot.sh OUT_DIR_OF_A_DEMO_RUN docs/kale-page.png  (needs Debian chromium)
# All-admins mode is a development setting: it stands in for a logged-in user here.
# Serve the real Airflow API server (with the Kale plugin) on the demo's state and screenshot /kale/.
set -e
H=$1; OUT=$2; PORT=18080
export AIRFLOW_HOME=$H/airflow KALE_HOME=$H/kale AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$H/airflow/airflow.db
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
"$(dirname "$0")/../.venv/bin/airflow" api-server --port $PORT > /tmp/apiserver.log 2>&1 &
PID=$!
for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:$PORT/api/v2/version && break; sleep 1; done
echo "anonymous /kale/api/state: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/kale/api/state)"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir=$(mktemp -d) --window-size=1300,1500 \
  --virtual-time-budget=8000 --screenshot=$OUT "http://127.0.0.1:$PORT/kale/" 2>/dev/null || true
kill $PID
