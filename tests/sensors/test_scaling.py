"""ScalingSensor: completes with the decision (XCom) exactly when it differs from the running count."""

import pytest

from kale_airflow.core.policies import Decision, Observation, Reason
from kale_airflow.sensors.scaling import ScalingSensor


class CurrentGeneration:
    """The control store as far as the sensor reads it: the current generation's name."""

    def __init__(self, name):
        self.name = name

    def current_generation(self):
        return self.name


class FixedAutoscaler:
    """Stands in for the manager: returns one decision (the sensor's own logic is under test).
    ``then``: the generation that becomes current while it observes (another apply won)."""

    shadow = False

    def __init__(self, running, target, reason, then=None):
        self.result = (Decision(target, reason, f"{running} -> {target}"), Observation(0.0, running, 1.0, 0.0, 0.0))
        self.state, self.then = CurrentGeneration("g000007-3w"), then

    def poke(self, now=None):
        if self.then:
            self.state.name = self.then
        return self.result


@pytest.mark.parametrize("running, target, reason, done", [
    (3, 3, Reason.HOLD, False), (3, 5, Reason.SCALE_UP_FORECAST, True), (5, 3, Reason.SCALE_DOWN_FORECAST, True),
    (0, 2, Reason.SCALE_UP_FORECAST, True),
], ids=["hold", "up", "down", "first-start"])
def test_poke_completes_only_on_a_change(running, target, reason, done):
    sensor = ScalingSensor(task_id="wait", deferrable=False)
    sensor._autoscaler = FixedAutoscaler(running, target, reason)
    result = sensor.poke({})
    assert result.is_done is done
    assert result.xcom_value == {"status": "scale" if done else "hold", "current": running, "shadow": False,
                                 "current_generation": "g000007-3w", "workers": target,
                                 "reason": reason.value, "message": f"{running} -> {target}"}


def test_the_decision_names_the_generation_current_before_it_observed():
    """Bug class: the generation read after the observation. If another apply made a new
    generation current meanwhile, the decision (based on the old one) would name the new one
    and its compare-and-set would replace a generation it never saw."""
    sensor = ScalingSensor(task_id="wait", deferrable=False)
    sensor._autoscaler = FixedAutoscaler(3, 5, Reason.SCALE_UP_FORECAST, then="g000008-4w")
    assert sensor.poke({}).xcom_value["current_generation"] == "g000007-3w"


def test_a_templated_poll_interval_leaves_a_numeric_poke_interval():
    sensor = ScalingSensor(task_id="wait", poll_interval_s="{{ params.poll_interval_s }}")
    assert sensor.poke_interval == 15.0 and sensor.poll_interval_s == "{{ params.poll_interval_s }}"


@pytest.mark.parametrize("param, flag", [(None, None), ("None", None), ("", None), ("True", True), ("false", False),
                                         (True, True)])
def test_the_shadow_param_reaches_the_trigger(tmp_path, monkeypatch, param, flag):
    from airflow.sdk.exceptions import TaskDeferred

    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    sensor = ScalingSensor(task_id="wait", poll_interval_s=2, max_polls=3, shadow=param)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    name, kwargs = deferred.value.trigger.serialize()
    assert name == "kale_airflow.triggers.scaling.ScalingTrigger"
    assert kwargs == {"poll_interval_s": 2.0, "max_polls": 3, "shadow": flag, "job": None}


def test_a_broken_deployment_file_fails_the_sensor_without_retries(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.delenv("KALE_CONFIG", raising=False)
    (tmp_path / "kale.yaml").write_text("max_workers: eight\n")
    with pytest.raises(AirflowFailException, match="max_workers"):
        ScalingSensor(task_id="wait", shadow=None).execute({})


def test_a_bad_shadow_value_is_named():
    from kale_airflow.control.shadow import as_flag

    with pytest.raises(ValueError, match="shadow must be true, false or empty"):
        as_flag("maybe")
