"""The rescale downtime Kale plans with: configured floor, measured median, look-ahead cap."""

from kale_airflow.core.policies.kale import KaleConfig, planned_downtime, scale_down_worth_it


def test_no_measurement_plans_with_the_configured_downtime():
    assert planned_downtime(90.0, [], 3600.0) == 90.0


def test_slower_measured_restarts_raise_it_to_their_median():
    assert planned_downtime(8.0, [40.0, 35.0, 300.0], 3600.0) == 40.0  # one outlier does not dominate


def test_faster_measured_restarts_never_lower_it_below_the_configured_floor():
    assert planned_downtime(90.0, [20.0, 30.0], 3600.0) == 90.0


def test_it_never_exceeds_the_look_ahead():
    assert planned_downtime(8.0, [120.0], 60.0) == 60.0


def test_a_scale_down_worth_it_at_the_configured_pause_is_not_at_the_measured_one():
    """The demo's thrash: 6 -> 4 saves 2 workers x 60 s; a 35 s pause of 6 workers costs more."""
    configured = KaleConfig(slo_s=60, rescale_downtime_s=8, lookahead_s=60)
    measured = KaleConfig(slo_s=60, rescale_downtime_s=planned_downtime(8, [35.0], 60), lookahead_s=60)
    assert scale_down_worth_it(6, 4, configured)[0]
    assert not scale_down_worth_it(6, 4, measured)[0]
