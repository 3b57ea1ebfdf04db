import json
import math

import numpy as np
import pytest

from kale_airflow.core.calibration import DEFAULT_RATE, MAX_OFFSET, AdaptiveCalibration

QS = (0.5, 0.8, 0.9)
Z = np.array([0.0, 0.8416, 1.2816])  # standard normal quantiles at QS
SIGMA = 0.1  # log-normal noise of the synthetic traffic
BIN_S = 300.0


def traffic(bins: int, seed: int = 0) -> np.ndarray:
    """Daily-shaped traffic with multiplicative log-normal noise, one value per 5-minute bin."""
    t = np.arange(bins)
    level = 100 + 60 * np.sin(2 * np.pi * t / 288)
    return level * np.exp(SIGMA * np.random.default_rng(seed).standard_normal(bins))


def true_paths(b: int, horizon: int, bias: float) -> np.ndarray:
    """The exact quantiles of bins b+1 .. b+horizon, multiplied by ``bias``."""
    t = b + 1 + np.arange(horizon)
    level = 100 + 60 * np.sin(2 * np.pi * t / 288)
    return bias * level[None, :] * np.exp(SIGMA * Z)[:, None]


def run(actual: np.ndarray, bias: float, horizon: int = 3, every: int = 1, cal=None, first: int = 0):
    """Drive a calibration as the forecast source does: observe each completed bin, then
    adjust and issue every ``every`` bins. Returns the calibration and what was issued."""
    cal = cal or AdaptiveCalibration(QS, horizon, BIN_S)
    issued = {}
    for b in range(first, len(actual)):
        cal.observe(b, actual[b])
        if b % every == 0:
            issued[b] = cal.adjust(true_paths(b, horizon, bias))
            cal.issue(b, issued[b])
    return cal, issued


def realised(actual: np.ndarray, issued: dict, since: int) -> np.ndarray:
    """Coverage per quantile of the issued one-step-ahead forecasts made from ``since`` on."""
    hits = [issued[b][:, 0] >= actual[b + 1] for b in issued if b >= since and b + 1 < len(actual)]
    return np.mean(hits, axis=0)


@pytest.mark.parametrize(
    "bias",
    [0.7, 1.0, 1.4],
    ids=["biased-30%-low-is-raised-to-nominal", "calibrated-stays-nominal", "biased-40%-high-is-lowered-to-nominal"],
)
def test_coverage_reaches_nominal_after_enough_bins(bias):
    actual = traffic(10 * 288)
    _, issued = run(actual, bias)
    cov = realised(actual, issued, since=5 * 288)  # the last 5 of 10 days
    np.testing.assert_allclose(cov, QS, atol=0.05)


@pytest.mark.parametrize("bias, sign", [(0.7, 1), (1.4, -1)], ids=["low-raises-offsets", "high-lowers-offsets"])
def test_a_biased_forecaster_is_corrected_by_about_its_bias(bias, sign):
    actual = traffic(10 * 288)
    cal, _ = run(actual, bias)
    assert (sign * cal.offsets > 0).all()
    np.testing.assert_allclose(cal.offsets.mean(), -math.log(bias), atol=0.1)


def test_a_calibrated_forecaster_stays_put():
    cal, _ = run(traffic(6 * 288), 1.0)
    assert np.abs(cal.offsets).max() < 0.1  # a tenth in log: within the noise of 10 %-noisy traffic


def test_a_bin_observed_twice_counts_once():
    cal = AdaptiveCalibration(QS, 2, BIN_S)
    cal.issue(0, np.ones((3, 2)))
    assert cal.observe(1, 5.0) == 1
    after_first = cal.offsets.copy()
    assert cal.observe(1, 5.0) == 0
    assert cal.observe(0, 5.0) == 0  # an earlier bin arriving late is ignored too
    np.testing.assert_array_equal(cal.offsets, after_first)
    assert cal.coverage()["q90"]["all"] == 0.0


def test_offsets_move_only_when_an_issued_forecast_meets_its_realised_bin():
    cal = AdaptiveCalibration(QS, 2, BIN_S)
    assert cal.observe(0, 100.0) == 0  # nothing issued for bin 0
    cal.issue(0, np.full((3, 2), 50.0))
    np.testing.assert_array_equal(cal.offsets, 0.0)  # issuing alone learns nothing
    cal.observe(1, 100.0)  # the forecast for bin 1, issued one step ahead, missed
    assert (cal.offsets[:, 0] > 0).all() and (cal.offsets[:, 1] == 0).all()


def test_changing_a_future_value_leaves_every_earlier_forecast_unchanged():
    actual = traffic(3 * 288)
    changed = actual.copy()
    k = 2 * 288
    changed[k:] *= 3.0
    _, a = run(actual, 0.8)
    _, b = run(changed, 0.8)
    for origin in a:
        if origin < k:  # learned from bins <= origin < k only
            np.testing.assert_array_equal(a[origin], b[origin])
    assert not np.allclose(a[k + 5], b[k + 5])  # the test can see a change where there is one


def test_state_dict_round_trips_through_json():
    actual = traffic(2 * 288)
    cal, _ = run(actual[:300], 0.8, horizon=4)
    restored = AdaptiveCalibration(QS, 4, BIN_S)
    restored.load_state_dict(json.loads(json.dumps(cal.state_dict())))
    assert restored.state_dict() == cal.state_dict()
    _, a = run(actual, 0.8, horizon=4, cal=cal, first=300)
    _, b = run(actual, 0.8, horizon=4, cal=restored, first=300)
    for origin in a:
        np.testing.assert_array_equal(a[origin], b[origin])
    assert restored.coverage() == cal.coverage()


@pytest.mark.parametrize(
    "quantiles, horizon", [((0.5, 0.9), 4), (QS, 5)], ids=["other-quantiles", "other-horizon"],
)
def test_a_state_of_another_configuration_is_refused(quantiles, horizon):
    state = AdaptiveCalibration(QS, 4, BIN_S).state_dict()
    with pytest.raises(ValueError, match="start a fresh one"):
        AdaptiveCalibration(quantiles, horizon, BIN_S).load_state_dict(state)


@pytest.mark.parametrize(
    "paths, offsets",
    [
        ([[10.0, 10.0], [12.0, 8.0], [11.0, 9.0]], [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]),
        ([[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]], [[0.5, 0.5], [0.0, 0.0], [-0.5, -0.5]]),
        ([[-3.0, 0.0], [-1.0, 2.0], [5.0, 4.0]], [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]),
    ],
    ids=["crossing-input", "offsets-that-would-cross", "negative-input"],
)
def test_adjusted_quantiles_are_ordered_and_non_negative(paths, offsets):
    cal = AdaptiveCalibration(QS, 2, BIN_S)
    cal.offsets = np.array(offsets)
    out = cal.adjust(np.array(paths))
    assert (out >= 0).all()
    assert (np.diff(out, axis=0) >= 0).all()
    assert out[-1].tolist() == np.max(np.maximum(paths, 0) * np.exp(offsets), axis=0).tolist()


@pytest.mark.parametrize("every", [1, 6, 12], ids=["every-bin", "every-half-hour", "every-hour"])
def test_offsets_move_per_hour_of_traffic_whatever_the_refresh_cadence(every):
    # Always crossed: the first step's offsets rise by rate * q per hour of forecasts scored.
    cal = AdaptiveCalibration(QS, 12, BIN_S)
    for b in range(50):
        cal.observe(b, 1000.0)
        if b == 1:  # the first forecast has no previous one to say how long it stood: start here
            start = cal.offsets[:, 0].copy()
        if b % every == 0:
            cal.issue(b, cal.adjust(np.ones((3, 12))))
    # Forecasts issued at bins 1..48 (every bin) or 6..48 (every 6) stood for 48 bins: 4 hours.
    np.testing.assert_allclose(cal.offsets[:, 0] - start, [DEFAULT_RATE * q * 4 for q in QS], rtol=1e-9)


def test_offsets_are_bounded_through_a_long_outage():
    cal = AdaptiveCalibration(QS, 2, BIN_S)
    for b in range(20 * 288):  # 20 days of zero traffic against a forecast of 100
        cal.observe(b, 0.0)
        cal.issue(b, np.full((3, 2), 100.0))
    assert cal.offsets.min() == -MAX_OFFSET


def test_memory_is_bounded_without_observations():
    cal = AdaptiveCalibration(QS, 3, BIN_S)
    for b in range(1000):
        cal.issue(b, np.ones((3, 3)))
    assert [o for o, _, _ in cal.state_dict()["issued"]] == [997, 998, 999]


def test_coverage_reports_nothing_before_a_score_and_the_realised_share_after():
    cal = AdaptiveCalibration(QS, 1, BIN_S)
    assert cal.coverage()["q90"] == {"all": None, "recent": None, "recent_by_step": [None]}
    for b, actual in enumerate([5.0, 15.0, 5.0, 5.0, 5.0]):
        cal.observe(b, actual)
        cal.issue(b, np.full((3, 1), 10.0))  # offsets still multiply 10 by less than e^0.01
    assert cal.coverage()["q90"]["all"] == pytest.approx(0.75)  # bins 1..4: one of four above 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"quantiles": (0.9, 0.5)}, "ascending"),
        ({"quantiles": (0.5, 1.0)}, "ascending"),
        ({"horizon": 0}, "horizon"),
        ({"bin_s": 0.0}, "bin_s"),
        ({"rate": -0.1}, "rate"),
        ({"rate": float("nan")}, "rate"),
    ],
    ids=["descending", "level-one", "no-horizon", "no-bin-length", "negative-rate", "nan-rate"],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveCalibration(**({"quantiles": QS, "horizon": 2, "bin_s": BIN_S} | kwargs))


@pytest.mark.parametrize(
    "paths", [np.ones((2, 2)), np.ones((3, 3)), np.array([[1.0, np.nan]] * 3)],
    ids=["wrong-quantile-count", "longer-than-horizon", "nan"],
)
def test_bad_forecasts_are_refused(paths):
    cal = AdaptiveCalibration(QS, 2, BIN_S)
    with pytest.raises(ValueError):
        cal.issue(0, cal.adjust(paths))


def test_a_reissued_forecast_keeps_how_long_it_stood():
    cal = AdaptiveCalibration(QS, 12, BIN_S)
    cal.issue(0, np.ones((3, 12)))
    cal.issue(6, np.ones((3, 12)))  # stood for 6 bins, half an hour
    cal.issue(6, np.ones((3, 12)))  # the same origin again, e.g. after a retry
    cal.observe(7, 1000.0)
    np.testing.assert_allclose(cal.offsets[:, 0], [DEFAULT_RATE * q * 0.5 for q in QS], rtol=1e-9)
