"""The anytime-valid A/B verdict (core/domain/sequential.py): its A/A error rate when read every day, against the
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
    mixture_rho2,
    shrunk_variance,
    unit_margin,
    users_needed,
    verdict,
)


def daily_looks(rng: np.random.Generator, base: float, effect: float, experiments: int, days: int, rate: int):
    """Running counts, sums and squares of binary scores per arm, after each day: shape (experiments, days)."""
    a = np.cumsum(rng.binomial(rate, base, size=(experiments, days)), axis=1).astype(float)
    b = np.cumsum(rng.binomial(rate, base + effect, size=(experiments, days)), axis=1).astype(float)
    n = np.broadcast_to(rate * np.arange(1, days + 1, dtype=float), a.shape)
    return n, a, b


def test_identical_arms_read_every_day_for_30_days_are_called_different_at_most_5_percent_of_the_time():
    """The old rule (a fixed 95% Welch interval recomputed at each look) calls a difference in far more A/A
    experiments in the same simulation; the studio's verdict stays under alpha with a margin (seeded)."""
    rng = np.random.default_rng(50)
    n, a, b = daily_looks(rng, 0.5, 0.0, experiments=2000, days=30, rate=40)
    _difference, low, high = difference_bounds(n, a / n, shrunk_variance(n, a, a), n, b / n, shrunk_variance(n, b, b))
    studio = excludes_zero(low, high).any(axis=1).mean()
    half = 1.959964 * np.sqrt((a / n) * (1 - a / n) / n + (b / n) * (1 - b / n) / n)
    old = (np.abs(b / n - a / n) > half).any(axis=1).mean()
    assert studio <= 0.04
    assert old > 0.15  # the same looks through the fixed interval: the simulation sees peeking


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
        spread = math.sqrt(production.variance / n_a + candidate.variance / n_b)
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
