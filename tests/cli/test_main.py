"""The ``kale`` command as a user runs it (the real console script, in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kale_airflow.cli.main import main
from tests.conftest import daily_series

KALE = Path(sys.executable).parent / "kale"


def test_help_documents_every_option():
    out = subprocess.run([str(KALE), "simulate", "--help"], capture_output=True, text=True, check=True).stdout
    for opt in ("--trace", "--policies", "--forecaster", "--slo-seconds", "--json", "--plot", "--days", "--cluster",
                "--hpa-window-s", "--keda-lag-threshold-s", "--autopilot-margin", "--autopilot-percentile"):
        assert opt in out
    assert "clairvoyant Kale" in out


@pytest.mark.slow
def test_simulate_on_the_bundled_trace_writes_json_and_plot(tmp_path):
    out = subprocess.run(
        [str(KALE), "simulate", "--days", "2", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png"),
         "--no-progress"],
        capture_output=True, text=True, check=True,
    )
    assert "lag/HPA" in out.stdout and "fluid bound" in out.stdout and "offline optimum" in out.stdout
    assert "clairvoyant Kale" in out.stdout and "\noracle " not in out.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["trace"] == "nyc_taxi_30min"
    assert set(doc["policies"]) == {"kale", "hpa", "keda", "autopilot", "static", "oracle"}
    keys = {"accumulated_lag", "mean_wait_s", "downtime_s", "slo_violation_rate", "gpu_hours", "rescales"}
    assert all(keys <= set(m) for m in doc["policies"].values())
    assert doc["limits"]["fluid_gpu_hours"] > 0
    assert doc["limits"]["fluid_gpu_hours"] <= doc["limits"]["offline_optimal_gpu_hours"]
    assert doc["config"]["slo_s"] == 300
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_policies_subset_and_slo_option(tmp_path):
    trace = tmp_path / "t.csv"
    daily_series(days=16).to_frame().to_csv(trace, index_label="timestamp")
    rc = main(["simulate", "--trace", str(trace), "--policies", "kale,static", "--slo-seconds", "120", "--days", "1",
               "--json", str(tmp_path / "o.json"), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert set(doc["policies"]) == {"kale", "static"} and doc["config"]["slo_s"] == 120


def test_bad_trace_gets_a_clear_error_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    rows = ["timestamp,value"] + [f"2024-01-01 00:{m:02d}:00,{'x' if m == 7 else 5}" for m in range(60)]
    bad.write_text("\n".join(rows))
    assert main(["simulate", "--trace", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "row 8: value 'x' is not a number" in err


def test_unknown_policy_is_a_usage_error():
    proc = subprocess.run([str(KALE), "simulate", "--policies", "kale,vpa"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown policy" in proc.stderr


def test_baseline_settings_and_a_misspecified_cluster_reach_the_run(tmp_path):
    trace = tmp_path / "t.csv"
    daily_series(days=16).to_frame().to_csv(trace, index_label="timestamp")
    rc = main(["simulate", "--trace", str(trace), "--policies", "kale,hpa,hpa@120s,keda,autopilot", "--days", "1",
               "--cluster", "comm", "--hpa-window-s", "60", "--keda-lag-threshold-s", "10", "--autopilot-margin", "0",
               "--autopilot-percentile", "0.9", "--json", str(tmp_path / "o.json"), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    c = doc["config"]
    assert c["cluster"]["kind"] == "comm" and c["profile_workers"] == [1, 2, 4, 8, 16]
    assert (c["hpa_window_s"], c["keda_lag_threshold_s"], c["autopilot_margin"], c["autopilot_percentile"]) == \
        (60, 10, 0, 0.9)
    assert set(doc["policies"]) == {"kale", "hpa", "hpa@120s", "keda", "autopilot"}


@pytest.mark.parametrize(
    "flags, adaptive", [([], True), (["--no-adaptive"], False), (["--adaptive-rate", "0.2"], True)],
    ids=["adaptive-by-default", "no-adaptive", "own-rate"],
)
def test_forecast_backtest_reports_rolling_coverage_with_and_without_adaptive(tmp_path, capsys, flags, adaptive):
    trace = tmp_path / "t.csv"
    daily_series(days=4, noise=0.1).to_frame().to_csv(trace, index_label="timestamp")
    rc = main(["forecast", "backtest", "--trace", str(trace), "--test-days", "1", "--no-progress",
               "--json", str(tmp_path / "m.json"), *flags])
    assert rc == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["adaptive"] is adaptive and set(doc["coverage_last_day"]) == {"q50", "q80", "q90"}
    assert "q90: coverage" in out and "(last day " in out
    assert ("quantiles calibrated online" in out) is adaptive and ("coverage_unadjusted" in doc) is adaptive
    if "--adaptive-rate" in flags:
        assert doc["adaptive_rate"] == 0.2 and "0.2 log units/h" in out
