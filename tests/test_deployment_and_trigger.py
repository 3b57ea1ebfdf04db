"""Configuration validation and the trigger's serialized form (pinned: the triggerer rebuilds it)."""

import pytest
import yaml

from kale_airflow.config import settings
from kale_airflow.deployment import ConfigError, Deployment, load_deployment
from kale_airflow.triggers.scaling import ScalingTrigger


def test_trigger_serializes_primitives_only():
    t = ScalingTrigger(poll_interval_s=5, max_polls=12)
    assert t.serialize() == ("kale_airflow.triggers.scaling.ScalingTrigger",
                             {"poll_interval_s": 5.0, "max_polls": 12})
    path, kwargs = t.serialize()
    assert ScalingTrigger(**kwargs).serialize() == (path, kwargs)


def test_defaults_are_the_embedded_deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    dep = load_deployment(settings())
    assert dep.stream_url == f"sqlite:///{tmp_path}/stream.db" and dep.worker_backend == "local"
    assert dep.kale_config.slo_s == 300 and dep.limits.upper == 8


@pytest.mark.parametrize(
    "data, message",
    [
        ({"worker_backend": "slurm"}, "worker_backend must be 'local' or 'kubernetes'"),
        ({"min_workers": 5, "max_workers": 2}, "max_workers (2) is below min_workers (5)"),
        ({"kale": {"lookahed_s": 10}}, "unknown kale setting(s) ['lookahed_s']"),
        ({"kale": {"lookahead_s": 10}}, "lookahead_s (10) must cover rescale_downtime_s"),
        ({"worker_backend": "kubernetes", "kubernetes": {"run_as_user": 0}}, "non-root"),
        ({"stream": "x"}, "unknown setting(s) ['stream']"),
        ({"partitions": 2, "min_workers": 3, "max_workers": 4}, "partitions (2) is below min_workers (3)"),
    ],
    ids=["backend", "min-max", "typo", "lookahead", "root", "unknown-key", "partitions"],
)
def test_bad_configuration_names_the_field(tmp_path, monkeypatch, data, message):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    (tmp_path / "kale.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_deployment(settings())
    assert message in str(err.value)


def test_missing_config_file_named_by_env_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_deployment(settings())


def test_kale_overrides_reach_the_policy():
    dep = Deployment(stream_url="sqlite:////tmp/x.db", slo_s=120, kale={"headroom": 0.1})
    assert dep.kale_config.headroom == 0.1 and dep.kale_config.slo_s == 120
