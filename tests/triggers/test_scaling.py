"""The trigger's serialized form is pinned: the triggerer rebuilds it from this dict."""

from kale_airflow.triggers.scaling import ScalingTrigger


def test_trigger_serializes_primitives_only():
    t = ScalingTrigger(poll_interval_s=5, max_polls=12)
    assert t.serialize() == ("kale_airflow.triggers.scaling.ScalingTrigger",
                             {"poll_interval_s": 5.0, "max_polls": 12})
    path, kwargs = t.serialize()
    assert ScalingTrigger(**kwargs).serialize() == (path, kwargs)
