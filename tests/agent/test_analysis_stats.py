"""Theil–Sen and Mann–Kendall on literal series, values derived by hand."""

import math

import pytest
from vramscope.agent.analysis.stats import mann_kendall, median, theil_sen


@pytest.mark.parametrize("values, expected", [
    ([3], 3.0), ([3, 1], 2.0), ([5, 1, 3], 3.0), ([4, 1, 3, 2], 2.5),
])
def test_median(values, expected):
    assert median(values) == expected


def test_theil_sen_ignores_an_outlier():
    # pairwise slopes 1, 1, 10/3, 1, 4.5, 8 -> median (1 + 10/3) / 2
    tr = theil_sen([0, 1, 2, 3], [0, 1, 2, 10])
    assert tr.slope == pytest.approx((1 + 10 / 3) / 2)
    # residuals 0, -1.1667, -2.3333, 3.5 -> median -0.58333
    assert tr.intercept == pytest.approx(-0.5833333333)


def test_theil_sen_band_brackets_the_slope_and_is_exact_on_a_line():
    tr = theil_sen([0, 1, 2, 3, 4], [1, 3, 5, 7, 9])
    assert (tr.slope, tr.intercept, tr.slope_low, tr.slope_high) == (2.0, 1.0, 2.0, 2.0)


def test_theil_sen_needs_two_distinct_x():
    with pytest.raises(ValueError, match="two points"):
        theil_sen([1, 1], [0, 5])


def test_mann_kendall_on_a_monotonic_series():
    # S = 10, var = 5*4*15/18, z = (S - 1) / sqrt(var)
    t = mann_kendall([1, 2, 3, 4, 5])
    z = 9 / math.sqrt(5 * 4 * 15 / 18)
    assert t.s == 10
    assert t.z == pytest.approx(z)
    assert t.p_rising == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert t.variance_factor == 1.0


def test_mann_kendall_falling_and_flat():
    assert mann_kendall([5, 4, 3, 2, 1]).s == -10
    flat = mann_kendall([2, 2, 2, 2, 2])
    assert (flat.s, flat.z, flat.p_rising) == (0, 0.0, 0.5)


def test_mann_kendall_ties_reduce_the_variance():
    # ys 1,1,2,3: S = 0+1+1 +1+1 +1 = 5; ties: one group of 2 -> var = (4*3*13 - 2*1*9) / 18
    t = mann_kendall([1, 1, 2, 3], slope_per_index=0.0)
    var = (4 * 3 * 13 - 2 * 1 * 9) / 18
    assert t.s == 5
    assert t.z * math.sqrt(var * t.variance_factor) == pytest.approx(4)


def test_autocorrelation_inflates_the_variance_of_a_wave():
    # a slow wave on a small trend: plain Mann-Kendall says p = 0.0015; the Hamed-Rao
    # correction over all lags would give variance x2.24 (its significant negative lags, half a
    # period away, cancel part of the positive ones); the short lags alone give x6.30, which
    # the test keeps, so p = 0.12: far from a leak verdict
    wave = [math.sin(i / 4) + i * 0.02 for i in range(60)]
    t = mann_kendall(wave)
    assert t.s == 466
    assert t.variance_factor == pytest.approx(6.2984876838, rel=1e-9)
    assert t.p_rising == pytest.approx(0.1186584964, rel=1e-6)
    plain_z = 465 / math.sqrt(60 * 59 * 125 / 18)
    assert 0.5 * math.erfc(plain_z / math.sqrt(2)) == pytest.approx(0.0015097952, rel=1e-6)


def test_rolling_minima_keep_their_correlation_over_the_window():
    """The leak detector's trend points are minima over 5 bins: correlated over lags 1-4 by
    construction (rank autocorrelations 0.81, 0.63, 0.50, 0.35 here). Over all lags the
    correction comes to x2.25, the chance correlations at long lags taking back most of it;
    the short lags alone say x5.32, and the larger factor is the test's."""
    import random

    rng = random.Random(7)
    noise = [rng.gauss(0.0, 1.0) for _ in range(124)]
    rolled = [min(noise[i:i + 5]) + 0.004 * i for i in range(120)]
    t = mann_kendall(rolled)
    assert t.s == 626
    assert t.variance_factor == pytest.approx(5.3166287632, rel=1e-9)
    assert t.p_rising == pytest.approx(0.2693354117, rel=1e-6)


def test_a_pure_sawtooth_is_not_a_significant_rise_at_the_leak_level():
    saw = [float(i % 10) for i in range(60)]
    assert mann_kendall(saw).p_rising > 1e-3


def test_load_coefficient_separates_the_load_from_the_time_trend():
    from vramscope.agent.analysis.stats import load_coefficient

    # 300 bytes per request in flight on a floor rising 2 bytes/s, the load rising with time
    # too (a morning): the fit tells them apart; one wild point (a prefill caught in the
    # window) does not move it (Huber weights)
    ts = [60.0 * i for i in range(40)]
    loads = [3 + (i % 7) + i // 10 for i in range(40)]
    ys = [1000.0 + 2.0 * t + 300.0 * n for t, n in zip(ts, loads)]
    assert load_coefficient(ts, ys, loads) == pytest.approx(300.0, rel=1e-9)
    ys[17] += 50_000.0
    assert load_coefficient(ts, ys, loads) == pytest.approx(300.0, rel=1e-3)
    # a load that never changes cannot be told from the floor: no answer, not 0
    assert load_coefficient(ts, ys, [5] * 40) is None


def test_hinge_fit_finds_where_a_rise_began_and_its_own_rate():
    from vramscope.agent.analysis.stats import hinge_fit

    # flat for 20 points, then +5 per step: the knee at 20 and the rate 5 (the straight line
    # over the whole would say about 3)
    xs = [float(i) for i in range(40)]
    ys = [100.0 if i <= 20 else 100.0 + 5.0 * (i - 20) for i in range(40)]
    knee, slope, f = hinge_fit(xs, ys, 6)
    assert (knee, slope) == (20.0, pytest.approx(5.0, rel=1e-9))
    assert f == math.inf  # an exact knee: nothing left for the noise
    # a straight line: the knee at the first point, the line's slope, no F
    assert hinge_fit(xs, [7.0 + 2.0 * x for x in xs], 6) == (0.0, pytest.approx(2.0, rel=1e-9),
                                                             0.0)
    # too few points after any knee: no knee after the first
    assert hinge_fit(xs[:5], ys[:5], 6)[1] == 0.0


def test_hinge_fit_f_tells_a_knee_from_noise():
    from vramscope.agent.analysis.stats import hinge_fit

    # a line with alternating +-1 noise: whatever knee fits best improves the fit by little
    xs = [float(i) for i in range(40)]
    noisy = [2.0 * x + (1.0 if i % 2 else -1.0) for i, x in enumerate(xs)]
    assert hinge_fit(xs, noisy, 6).f < 3.84
    # flat, then +5 per step, with the same noise: the knee is far beyond it
    bent = [100.0 + 5.0 * max(0.0, x - 20.0) + (1.0 if i % 2 else -1.0)
            for i, x in enumerate(xs)]
    knee, slope, f = hinge_fit(xs, bent, 6)
    assert knee == 20.0 and slope == pytest.approx(5.0, rel=0.02) and f > 1000.0
