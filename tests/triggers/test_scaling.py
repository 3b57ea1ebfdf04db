"""The trigger's serialized form is pinned: the triggerer rebuilds it from this dict."""

from kale_airflow.triggers.scaling import ScalingTrigger


def test_trigger_serializes_primitives_only():
    t = ScalingTrigger(poll_interval_s=5, max_polls=12)
    assert t.serialize() == ("kale_airflow.triggers.scaling.ScalingTrigger",
                             {"poll_interval_s": 5.0, "max_polls": 12, "shadow": None, "job": None})
    path, kwargs = t.serialize()
    assert ScalingTrigger(**kwargs).serialize() == (path, kwargs)
    assert ScalingTrigger(5, 12, shadow=True).serialize()[1]["shadow"] is True
    assert ScalingTrigger(5, 12, job="ads").serialize()[1]["job"] == "ads"  # a fleet's trigger scales its job
    # a trigger serialized before shadow mode existed still rebuilds (as configured)
    assert ScalingTrigger(poll_interval_s=5.0, max_polls=12).shadow is None
