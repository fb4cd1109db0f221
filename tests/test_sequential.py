"""The anytime-valid A/B verdict (core/domain/sequential.py): its A/A error rate when read after every user, against the
fixed-sample interval it replaced, its tuning, its small-sample guards, and the users a difference needs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from core.domain.sequential import (
    ALPHA,
    MIN_PER_ARM,
    OPTIMAL_AT,
    ArmScores,
    difference_bounds,
    excludes_zero,
    floored_variances,
    mixture_rho2,
    running_bounds,
    shrunk_variance,
    unit_margin,
    users_needed,
    verdict,
    verdict_in_order,
)


def read_after_every_user(share: float, base: float, experiments: int = 1000, users: int = 2400, seed: int = 60):
    """Running bounds of A/A experiments (one binary score per user), read after every user; and the flags of whether
    stop 63's rule (each arm's own shrunk variance, no pooled floor) excluded zero at each user."""
    rng = np.random.default_rng(seed)
    candidate = rng.random((experiments, users)) < share
    values = (rng.random((experiments, users)) < base).astype(float)
    _difference, low, high = running_bounds(candidate, values)
    n_a, n_b = np.cumsum(~candidate, axis=1, dtype=float), np.cumsum(candidate, axis=1, dtype=float)
    s_a, s_b = np.cumsum(values * ~candidate, axis=1), np.cumsum(values * candidate, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        _d, old_low, old_high = difference_bounds(n_a, s_a / n_a, shrunk_variance(n_a, s_a, s_a), n_b, s_b / n_b,
                                                  shrunk_variance(n_b, s_b, s_b))
    return excludes_zero(low, high).any(axis=1).mean(), excludes_zero(old_low, old_high).any(axis=1).mean()


@pytest.mark.parametrize(("share", "base"), [(0.75, 0.6), (0.1, 0.9), (0.05, 0.97)])
def test_identical_arms_read_after_every_user_for_30_days_are_called_different_at_most_5_percent_of_the_time(
        share, base):
    """The grid's worst cell for the studio's verdict (share 0.75, base rate 0.6: bench/ab_peeking.py) and two where
    stop 63's rule declared 9-11% of A/A experiments different (a small arm whose first users all agree): the studio
    stays at or under alpha, and the same simulation through stop 63's rule shows it sees the problem (seeded)."""
    studio, old = read_after_every_user(share, base)
    assert studio <= ALPHA
    if share != 0.75:
        assert old > ALPHA


def test_the_pooled_floor_keeps_a_small_arm_whose_users_all_agree_from_a_point_interval():
    """Ten candidate users all scoring 1 beside 500 production users at 0.9: their own variance is shrunk toward 1/4
    by two pseudo-users only, so the floor is what holds; the candidate's variance is the pooled one."""
    production = ArmScores.of([1.0] * 450 + [0.0] * 50)
    candidate = ArmScores.of([1.0] * 10)
    var_a, var_b = floored_variances(production, candidate)
    pooled = (450 * 50 / 500 + 0.0 + 2 * 0.25) / (500 + 10 - 2 + 2)  # both arms' squared deviations, shrunk alike
    assert var_b == pytest.approx(pooled) and var_b > 1.9 * candidate.variance
    assert not verdict(production, candidate).decided


def test_the_interval_is_the_running_intersection_and_a_difference_once_shown_stays_shown():
    rng = np.random.default_rng(11)
    arms = rng.random(3000) < 0.5
    values = (rng.random(3000) < np.where(arms, 0.7, 0.5)).astype(float)
    _difference, low, high = running_bounds(arms, values)
    valid = ~np.isnan(low)
    assert (np.diff(low[valid]) >= 0).all() and (np.diff(high[valid]) <= 0).all()
    first = int(np.argmax(low > 0))
    assert low[first] > 0 and (low[first:] > 0).all()
    arrivals = list(zip(arms.tolist(), values.tolist(), strict=True))
    assert verdict_in_order(arrivals).low == pytest.approx(low[-1])
    assert verdict_in_order(arrivals[:first + 1]).better
    assert verdict_in_order([(True, 1.0)] * 20).difference is None


def test_a_real_difference_is_found_and_its_sign_said():
    rng = np.random.default_rng(7)
    production = ArmScores.of(list(rng.binomial(1, 0.5, 1500).astype(float)))
    candidate = ArmScores.of(list(rng.binomial(1, 0.6, 1500).astype(float)))
    better = verdict(production, candidate)
    assert better.decided and better.better and not better.worse and better.low > 0
    worse = verdict(candidate, production)
    assert worse.decided and worse.worse and worse.high < 0
    assert math.isclose(worse.difference, -better.difference)


def test_no_verdict_before_each_arm_has_its_minimum_and_agreeing_scores_are_not_a_certainty():
    few = verdict(ArmScores.of([0.0] * (MIN_PER_ARM - 1)), ArmScores.of([1.0] * 50))
    assert few.difference == 1.0 and few.low is None and not few.decided
    # every score alike in each arm: a sample variance of 0 would make the interval a point; shrunk, it is not
    same = verdict(ArmScores.of([1.0] * MIN_PER_ARM), ArmScores.of([1.0] * MIN_PER_ARM))
    assert same.low < 0 < same.high and not same.decided
    assert verdict(ArmScores.of([]), ArmScores.of([1.0])).difference is None


def test_the_mixture_is_tightest_where_it_was_tuned():
    alpha = ALPHA
    approx = (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / OPTIMAL_AT
    assert mixture_rho2() == pytest.approx(approx, rel=0.05)
    tuned = float(unit_margin(OPTIMAL_AT))
    for elsewhere in (OPTIMAL_AT / 10, OPTIMAL_AT * 10):
        assert tuned < float(unit_margin(OPTIMAL_AT, optimal_at=elsewhere))
    # wider than the fixed-sample interval at every size, and shrinking as traces arrive
    sizes = np.array([20, 100, 500, 5000])
    margins = unit_margin(sizes) * np.sqrt(sizes)
    assert (margins > norm.ppf(1 - alpha / 2)).all() and (np.diff(unit_margin(sizes)) < 0).all()


def test_users_needed_is_the_first_count_where_a_difference_of_that_size_would_be_found():
    rng = np.random.default_rng(3)
    production = ArmScores.of(list(rng.binomial(1, 0.5, 60).astype(float)))
    candidate = ArmScores.of(list(rng.binomial(1, 0.5, 40).astype(float)))
    small = users_needed(production, candidate, 0.05, candidate_share=0.4)
    large = users_needed(production, candidate, 0.10, candidate_share=0.4)
    assert small > large > 0

    def found_at(total: int) -> bool:
        share = candidate.n / (candidate.n + production.n)
        n_a, n_b = total * (1 - share), total * share
        var_a, var_b = floored_variances(production, candidate)
        spread = math.sqrt(var_a / n_a + var_b / n_b)
        return spread * (math.sqrt(total) * float(unit_margin(total)) + norm.ppf(0.8)) <= 0.10

    total = large + 100
    assert found_at(total) and not found_at(total - 1)
    assert users_needed(production, candidate, 1e-6, candidate_share=0.4, cap=10_000) is None
    with pytest.raises(ValueError):
        users_needed(production, candidate, 0.0, candidate_share=0.4)


def test_a_user_is_one_unit_whatever_their_number_of_traces():
    """ArmScores.of_users: each user's mean is one value; `traces` is kept beside `n`, never counted as units."""
    neutral = {f"u{i}": [0.25, 0.75] for i in range(15)}
    heavy = {**{f"v{i}": [0.25, 0.75] for i in range(14)}, "heavy": [1.0] * 200}
    production, candidate = ArmScores.of_users(neutral), ArmScores.of_users(heavy)
    assert (candidate.n, candidate.traces, production.n, production.traces) == (15, 228, 15, 30)
    assert candidate.mean == pytest.approx(8 / 15) and not verdict(production, candidate).decided
    flat = [score for scores in heavy.values() for score in scores]  # counted per trace, the heavy user decides
    assert verdict(ArmScores.of([s for scores in neutral.values() for s in scores]), ArmScores.of(flat)).better
    assert ArmScores.of_users({"none": []}).n == 0
