"""``kale simulate --fleet``: several jobs on one GPU budget from a fleet file."""

import json

import yaml

from kale_airflow.cli.main import build_parser, main
from tests.conftest import daily_series


def fleet_file(tmp_path, gpus=40, **extra):
    for name, seed in (("ads", 1), ("feed", 2)):
        (daily_series(days=15, step_s=300, noise=0.1, seed=seed) * 10).to_frame().to_csv(
            tmp_path / f"{name}.csv", index_label="timestamp")
    doc = {"gpus": gpus, "jobs": [
        {"name": "ads", "trace": "ads.csv", "priority": 2, "slo_s": 240},
        {"name": "feed", "trace": "feed.csv", "min_workers": 2, "max_workers": 48,
         "schedule_overrides": [{"cron": "0 1 * * *", "duration": "1h", "min_workers": 6}]},
    ]} | extra
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_fleet_simulation_prints_the_table_and_writes_json(tmp_path, capsys):
    rc = main(["simulate", "--fleet", str(fleet_file(tmp_path)), "--days", "0.1", "--fleet-policies",
               "fleet-kale,static-split", "--json", str(tmp_path / "out.json"), "--no-progress", "--jobs", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "fleet fleet.yaml: 2 jobs on 40 GPUs, 0.1 days" in out
    assert "fleet-kale" in out and "static-split" in out and "exceeded 0 ticks" in out
    doc = json.loads((tmp_path / "out.json").read_text())
    assert set(doc["policies"]) == {"fleet-kale", "static-split"}
    assert [j["name"] for j in doc["jobs"]] == ["ads", "feed"] and doc["jobs"][0]["slo_s"] == 240
    assert doc["jobs"][1]["schedule_overrides"] == ["cron '0 1 * * *' for 60 min (min 6)"]
    feed = doc["policies"]["fleet-kale"]["jobs"]["feed"]
    assert feed["override_ticks"] == 1 * 3600 / 15 and feed["below_floor_ticks"] == 0
    for run in doc["policies"].values():
        assert run["total"]["budget_exceeded_ticks"] == 0


def test_a_budget_below_the_floors_is_a_clear_error(tmp_path, capsys):
    path = fleet_file(tmp_path, gpus=1)
    assert main(["simulate", "--fleet", str(path), "--no-progress"]) == 2
    assert "the fleet's floors need 3 GPUs (ads 1, feed 2) but the budget is 1" in capsys.readouterr().err


def test_a_missing_fleet_file_or_policy_is_a_clear_error(tmp_path, capsys):
    assert main(["simulate", "--fleet", str(tmp_path / "none.yaml"), "--no-progress"]) == 2
    assert "fleet file" in capsys.readouterr().err
    rc = main(["simulate", "--fleet", str(fleet_file(tmp_path)), "--days", "0.05", "--fleet-policies", "hpa",
               "--no-progress"])
    assert rc == 2 and "unknown fleet policy" in capsys.readouterr().err


def test_help_documents_the_fleet_options():
    text = build_parser()._subparsers._group_actions[0].choices["simulate"].format_help()
    assert "--fleet FLEET.yaml" in text and "--fleet-policies" in text
