"""ScalingSensor: completes with the decision (XCom) exactly when it differs from the running count."""

import pytest

from kale_airflow.core.policies import Decision, Observation, Reason
from kale_airflow.sensors.scaling import ScalingSensor


class FixedAutoscaler:
    """Stands in for the manager: returns one decision (the sensor's own logic is under test)."""

    def __init__(self, running, target, reason):
        self.result = (Decision(target, reason, f"{running} -> {target}"), Observation(0.0, running, 1.0, 0.0, 0.0))

    def poke(self):
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
    assert result.xcom_value == {"status": "scale" if done else "hold", "current": running, "workers": target,
                                 "reason": reason.value, "message": f"{running} -> {target}"}


def test_a_templated_poll_interval_leaves_a_numeric_poke_interval():
    sensor = ScalingSensor(task_id="wait", poll_interval_s="{{ params.poll_interval_s }}")
    assert sensor.poke_interval == 15.0 and sensor.poll_interval_s == "{{ params.poll_interval_s }}"
