"""The configuration: one typed, strict parse of the environment and the deployment file,
with errors that name the file, the field, what was expected and what was found."""

import pytest
import yaml

from kale_airflow.config import ConfigError, Deployment, load_config, load_deployment, settings


def test_defaults_are_the_embedded_deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    cfg = load_config()
    dep = cfg.deployment
    assert dep.stream_url == f"sqlite:///{tmp_path}/stream.db" and dep.worker_backend == "local"
    assert dep.kale_config.slo_s == 300 and dep.limits.upper == 8
    assert cfg.settings.database_url == f"sqlite:///{tmp_path}/kale.db"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"worker_backend": "slurm"}, "worker_backend: input should be 'local' or 'kubernetes', got 'slurm' (str)"),
        ({"min_workers": 5, "max_workers": 2}, "max_workers (2) is below min_workers (5)"),
        ({"kale": {"horizn_s": 10}}, "kale.horizn_s: unknown setting; allowed here: "),
        ({"kale": {"horizon_s": 10}}, "horizon_s (10.0) must cover two restarts"),
        ({"kale": {"wait_cost": 0}}, "wait_cost (0.0) must be >= 0.1"),
        ({"worker_backend": "kubernetes", "kubernetes": {"run_as_user": 0}}, "kubernetes.run_as_user: run_as_user 0"),
        ({"stream": "x"}, "stream: unknown setting; allowed here: "),
        ({"partitions": 2, "min_workers": 3, "max_workers": 4}, "partitions (2) is below min_workers (3)"),
        ({"max_workers": "15"}, "max_workers: input should be a valid integer, got '15' (str)"),
        ({"slo_s": "fast"}, "slo_s: input should be a valid number, got 'fast' (str)"),
        ({"kubernetes": {"gpus_per_worker": -1}}, "kubernetes.gpus_per_worker: input should be greater than or equal"),
    ],
    ids=["backend", "min-max", "typo", "horizon", "wait-cost-zero", "root", "unknown-key", "partitions", "string-int",
         "string-float", "negative-gpus"],
)
def test_bad_configuration_names_the_file_and_the_field(tmp_path, monkeypatch, data, message):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_deployment(settings())
    assert message in str(err.value)
    assert str(tmp_path / "kale.yaml") in str(err.value)


def test_every_problem_is_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump({"max_workers": "8", "poll_interval_s": -1, "typo": 1}))
    with pytest.raises(ConfigError) as err:
        load_deployment(settings())
    assert all(f in str(err.value) for f in ("max_workers:", "poll_interval_s:", "typo:"))


@pytest.mark.parametrize("text, message", [("- a\n- b\n", "must be a mapping of settings, got a list"),
                                           ("a: [1,\n", "is not valid YAML")], ids=["list", "syntax"])
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path, monkeypatch, text, message):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    (tmp_path / "kale.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_deployment(settings())


def test_missing_config_file_named_by_env_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_deployment(settings())


def test_kale_overrides_reach_the_policy():
    dep = Deployment(stream_url="sqlite:////tmp/x.db", slo_s=120, kale={"wait_cost": 0.5})
    assert dep.kale_config.wait_cost == 0.5 and dep.kale_config.slo_s == 120


def test_integers_are_valid_floats_and_the_result_is_frozen():
    dep = Deployment(stream_url="sqlite:////tmp/x.db", slo_s=120, poll_interval_s=2)
    assert dep.kale_config.interval_s == 2.0
    with pytest.raises(ValueError):
        dep.slo_s = 1
