"""``jobs:`` in the deployment file: what each job inherits, what it may override, and the
mistakes refused at validation (not at the first decision)."""

import pytest

from kale_airflow.config import ConfigError, dag_id, job_of_dag, parse_deployment

TOP = {"stream_url": "sqlite:///top.db", "max_workers": 16, "slo_s": 120, "kale": {"horizon_s": 1800},
       "kubernetes": {"namespace": "training", "gpus_per_worker": 2}}


def test_a_file_without_jobs_is_the_default_job_unchanged():
    """Bug class: today's single-job files changing meaning (DAG ids, rows, settings)."""
    dep = parse_deployment(TOP)
    assert list(dep.all_jobs) == ["default"] and dep.all_jobs["default"] is dep and dep.for_job(None) is dep
    assert dag_id("kale_autoscaler", dep.job) == "kale_autoscaler" and job_of_dag("kale_autoscaler") == "default"


def test_each_job_inherits_the_top_level_and_overrides_what_it_names_section_by_key():
    dep = parse_deployment(TOP | {"jobs": [
        {"name": "ranking", "stream_url": "kafka://k:9092/ranking", "priority": 3, "kale": {"wait_cost": 3.0}},
        {"name": "ads", "min_workers": 2, "kubernetes": {"gpus_per_worker": 1}}]})
    ranking, ads = dep.for_job("ranking"), dep.for_job("ads")
    assert (ranking.job, ranking.priority, ranking.stream_url, ranking.max_workers) == ("ranking", 3.0,
                                                                                        "kafka://k:9092/ranking", 16)
    assert ranking.kale.horizon_s == 1800 and ranking.kale.wait_cost == 3.0  # merged key by key
    assert (ads.stream_url, ads.min_workers, ads.slo_s, ads.kale.wait_cost) == ("sqlite:///top.db", 2, 120, 1.5)
    assert ads.kubernetes.gpus_per_worker == 1 and ads.kubernetes.namespace == "training"
    assert dag_id("kale_training", "ads") == "kale_training__ads" and job_of_dag("kale_training__ads") == "ads"
    with pytest.raises(ConfigError, match=r"this deployment has 2 jobs \(ranking, ads\); name one"):
        dep.for_job(None)
    with pytest.raises(ConfigError, match=r"no job 'feed' in this deployment; its jobs: ranking, ads"):
        dep.for_job("feed")


@pytest.mark.parametrize("jobs, fleet, message", [
    ([{"name": "a", "stream_url": "sqlite:///a.db"}, {"name": "a", "stream_url": "sqlite:///b.db"}], None,
     r"jobs\[1\]: the name 'a' is used twice"),
    ([{"name": "a"}, {"name": "b"}], None, "jobs a and b read sqlite:///top.db with the same group 'kale'"),
    ([{"name": "a", "stream_url": "sqlite:///a.db", "min_workers": 3},
      {"name": "b", "stream_url": "sqlite:///b.db", "min_workers": 2}], {"gpus": 4},
     r"the fleet's floors need 5 GPUs \(a 3, b 2\) but the budget is 4"),
    ([{"name": "a", "max_workers": "8"}], None, r"jobs\[0\] \(a\) max_workers: input should be a valid integer"),
    ([{"name": "a", "colour": "red"}], None, r"jobs\[0\] \(a\) colour: unknown setting"),
    ([{"name": "Ads"}], None, "every job needs a name of lowercase letters"),
    ([{"stream_url": "sqlite:///a.db"}], None, "every job needs a name"),
    ([{"name": "a", "fleet": {"gpus": 4}}], None, "jobs, fleet and job are set at the top level only"),
    ([], None, "jobs: is empty"),
    ([{"name": "a", "schedule_overrides": [{"cron": "0 19 * * *", "min_workers": 4}]}], None,
     "needs five valid fields and a positive duration"),
], ids=["duplicate-name", "shared-commits", "floors-over-budget", "bad-type", "unknown-key", "bad-name",
        "no-name", "fleet-in-a-job", "empty", "window-without-duration"])
def test_mistakes_in_jobs_are_refused_naming_the_job_and_the_fix(jobs, fleet, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_deployment(TOP | {"jobs": jobs} | ({"fleet": fleet} if fleet else {}), "kale.yaml")
    assert str(err.value).startswith("kale.yaml: invalid configuration")


def test_a_jobs_folders_models_and_assets_are_its_own(tmp_path, monkeypatch):
    """Bug classes: two jobs sharing a checkpoint folder, a pool lock, a run folder or a
    registered model; the default job's names changing."""
    from kale_airflow.config import settings
    from kale_airflow.control.promotions import asset_uri
    from kale_airflow.registry.mlflow_registry import job_models, job_of_model

    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    plain, ads = settings(), settings("ads")
    assert (plain.checkpoints, plain.worker_logs) == (tmp_path / "checkpoints", tmp_path / "worker-logs")
    assert (ads.checkpoints, ads.worker_logs) == (tmp_path / "jobs/ads/checkpoints", tmp_path / "jobs/ads/worker-logs")
    assert plain.run_dir("r1") == tmp_path / "runs/r1" and ads.run_dir("r1") == tmp_path / "jobs/ads/runs/r1"
    assert job_models() == ("kale-traffic-forecaster", "kale-throughput-model")
    assert job_models("ads") == ("kale-traffic-forecaster-ads", "kale-throughput-model-ads")
    assert [job_of_model(m) for m in (*job_models(), *job_models("ads"), "other")] == [
        "default", "default", "ads", "ads", None]
    assert [asset_uri(m) for m in (*job_models(), *job_models("ads"))] == [
        "kale://models/forecaster", "kale://models/throughput", "kale://models/forecaster/ads",
        "kale://models/throughput/ads"]
    with pytest.raises(KeyError, match="is not a kale model"):
        asset_uri("someone-elses-model")
