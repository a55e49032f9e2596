"""orthogpt/scaling.py: the fit of L(C) = E + A·C^(−α) recovers known laws from synthetic points, its
standard errors cover the truth about as often as they should, and the compute multiplier agrees with
hand-worked examples, none below the baseline's asymptote."""

import math

import numpy as np
import pytest

from orthogpt import scaling

E, A, ALPHA = 1.45, 2.0e3, 0.31  # a law of the order of a small character model's
COMPUTE = np.geomspace(1e11, 3e14, 5)  # five sizes, as the CPU miniseries


def points(noise=0.0, seeds=1, rng=None):
    C = np.repeat(COMPUTE, seeds)
    L = E + A * C ** -ALPHA
    return C, L + (rng.normal(0, noise, len(L)) if noise else 0)


def test_the_fit_recovers_an_exact_law():
    f = scaling.fit(*points())
    assert (f.E, f.A, f.alpha) == pytest.approx((E, A, ALPHA), rel=1e-6)
    assert f.n == 5 and f.rss < 1e-20 and f.span == (COMPUTE[0], COMPUTE[-1])
    assert np.all(f.se < 1e-6 * np.abs(f.params))  # an exact law leaves no residual: no uncertainty
    assert f.compute(f.loss(3e12)) == pytest.approx(3e12, rel=1e-9)
    assert f.loss(COMPUTE) == pytest.approx(E + A * COMPUTE ** -ALPHA, rel=1e-9)


def test_three_sizes_fit_exactly_but_give_no_uncertainty():
    f = scaling.fit(COMPUTE[:3], E + A * COMPUTE[:3] ** -ALPHA)
    assert (f.E, f.A, f.alpha) == pytest.approx((E, A, ALPHA), rel=1e-6)
    assert f.cov is None and f.se is None


def test_the_fit_of_noisy_seeds_lies_within_its_standard_errors_of_the_truth():
    rng = np.random.default_rng(0)
    f = scaling.fit(*points(noise=0.004, seeds=2, rng=rng))
    assert f.n == 10 and f.se is not None
    assert np.all(np.abs(f.params - (E, A, ALPHA)) < 3 * f.se), (f.params, f.se)
    assert f.se[2] < 0.2 * ALPHA  # the exponent is measured, not merely bounded


def test_the_standard_error_of_the_exponent_covers_the_truth_about_two_times_in_three():
    """Over 200 synthetic series (5 sizes x 3 seeds, Gaussian noise): |α̂ − α| ≤ se(α̂) in about 68% of
    them, as the covariance s² (JᵀJ)⁻¹ promises where the errors are independent and of one variance."""
    rng = np.random.default_rng(1)
    hits = []
    for _ in range(200):
        f = scaling.fit(*points(noise=0.003, seeds=3, rng=rng))
        hits.append(abs(f.alpha - ALPHA) <= f.se[2])
    assert 0.55 <= np.mean(hits) <= 0.8, np.mean(hits)


@pytest.mark.parametrize('compute, loss, why', [
    ([1e12, 1e12, 1e13, 1e13], [2.0, 2.01, 1.8, 1.81], 'need 3 or more sizes'),
    (COMPUTE, 2.0 - 1e3 * COMPUTE ** -0.3, 'does not fall with compute'),
    ([1e12, 0.0, 1e13], [2.0, 1.9, 1.8], 'positive, finite compute'),
])
def test_points_that_do_not_determine_the_law_give_no_fit_and_say_why(compute, loss, why):
    with pytest.raises(scaling.NoFit, match=why):
        scaling.fit(compute, loss)


def test_points_that_do_not_bend_get_the_power_law_with_e_0():
    """Losses straight in log C (2.5 - 0.02 ln C) bend less than any E + A C^-α: its fit would drift to α -> 0,
    E -> -inf. The fit with E = 0 takes its place, close to them, and the multiplier follows from it."""
    compute = np.repeat(COMPUTE, 2)
    loss = 2.5 - 0.02 * np.log(compute) + 1e-4 * np.tile([1, -1], len(COMPUTE))
    f = scaling.fit(compute, loss)
    assert f.E_fixed and f.E == 0.0 and f.cov[0].tolist() == [0.0, 0.0, 0.0] and f.n == 10
    assert np.abs(f.loss(compute) - loss).max() < 2e-3 and f.se[2] < 0.1 * f.alpha
    m = scaling.multiplier(f, float(f.loss(8 * COMPUTE[0])), COMPUTE[0])
    assert m.value == pytest.approx(8.0, rel=1e-6)


BASE = scaling.Fit(E=1.0, A=10.0, alpha=0.5, cov=np.diag([1e-4, 1e-2, 1e-4]), n=8, rss=0.0, span=(10.0, 1000.0))


def test_the_multiplier_of_a_measured_loss_by_hand():
    """The baseline L_b(C) = 1 + 10/√C reaches 1.5 at √C = 20, C = 400: a rule with loss 1.5 at
    C = 100 is worth 4x. ln M = (ln A − ln(L − E))/α − ln C has the gradient (1/(α(L−E)), 1/(αA),
    −(ln A − ln(L − E))/α²) = (4, 0.2, −11.983) in (E, A, α), so se(M) = 4 √(16e-4 + 0.04e-2 +
    143.59e-4) = 0.5116; a loss of standard error 0.01 adds 4² x 1e-4 (∂ ln M/∂L = −4)."""
    m = scaling.multiplier(BASE, 1.5, 100.0)
    assert m.value == pytest.approx(4.0, rel=1e-12) and m.note == ''
    assert m.se == pytest.approx(4 * math.sqrt(16e-4 + 0.04e-2 + 143.5906e-4), rel=1e-4)
    with_loss = scaling.multiplier(BASE, 1.5, 100.0, loss_se=0.01)
    assert with_loss.se == pytest.approx(4 * math.sqrt(16e-4 + 0.04e-2 + 143.5906e-4 + 16e-4), rel=1e-4)
    no_cov = scaling.multiplier(scaling.Fit(1.0, 10.0, 0.5, None, 3, 0.0, (10.0, 1000.0)), 1.5, 100.0)
    assert no_cov.value == pytest.approx(4.0) and no_cov.se is None


def test_the_fitted_multiplier_by_hand():
    """A rule with L_r(C) = 1 + 5/√C reaches at every C what the baseline 1 + 10/√C reaches at 4C."""
    rule = scaling.Fit(E=1.0, A=5.0, alpha=0.5, cov=np.diag([1e-4, 1e-2, 1e-4]), n=8, rss=0.0, span=(10.0, 1000.0))
    for c in (25.0, 100.0, 200.0):
        m = scaling.fitted_multiplier(BASE, rule, c)
        assert m.value == pytest.approx(4.0, rel=1e-12) and m.se > 0
    assert scaling.fitted_multiplier(BASE, BASE, 100.0).value == pytest.approx(1.0)


def test_a_loss_below_the_baseline_asymptote_has_no_multiplier():
    for m in (scaling.multiplier(BASE, 0.9, 100.0), scaling.multiplier(BASE, 1.0, 100.0),
              scaling.fitted_multiplier(BASE, scaling.Fit(0.8, 5.0, 0.5, None, 3, 0.0, (10.0, 1000.0)), 1e6)):
        assert m.value is None and m.se is None
        assert "below the baseline's asymptote E = 1.0000" in m.note


def test_a_multiplier_beyond_the_baseline_runs_says_it_extrapolates():
    m = scaling.multiplier(BASE, 1.1, 100.0)  # the baseline reaches 1.1 at C = 10,000, beyond its runs' 1,000
    assert m.value == pytest.approx(100.0) and 'extrapolated to 1e+04 FLOPs' in m.note
