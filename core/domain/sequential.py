"""An A/B verdict that may be read at any time: a confidence sequence for the difference of two arms' mean scores.

A fixed-sample 95% interval read every day calls a difference between two identical versions far more often than
one time in twenty (issue 50: 28.5% of A/A experiments within 30 daily looks at 40 scored traces an arm a day). A
confidence sequence covers the true difference at every moment at once, so it may be read after every trace, for as
long as the experiment runs, and the chance that it ever excludes the truth stays at most `alpha`.

The boundary is the Gaussian-mixture asymptotic confidence sequence (AsympCS) of I. Waudby-Smith, D. Arbour,
R. Sinha, E. H. Kennedy and A. Ramdas, "Time-uniform central limit theory and asymptotic confidence sequences",
Annals of Statistics 52(6), 2024 (arXiv:2103.06476), Theorem 2.2:

    estimate_t ± sigma_t * sqrt( 2 (t rho² + 1) / (t² rho²) * log( sqrt(t rho² + 1) / alpha ) )

with rho² = (-W₋₁(-alpha² / e) - 1) / t*, the value that makes it tightest after t* units (W₋₁ is the lower branch
of Lambert's W; -2 log alpha + log(1 - 2 log alpha) is its usual approximation). For the difference of the arms of a
randomized experiment (their Section 3) the units are the randomised units of both arms, t = n_a + n_b, and sigma_t²
is the variance per unit of the difference in means, t (s_a² / n_a + s_b² / n_b).

The unit is the user, because the user is what the split randomises (core/records/ab_experiments.served_arm hashes the
user id): the theorem needs independent units, and one user's traces are not independent of each other (the same
person, the same kind of question, the same version all along). Counted per trace, one heavy user who sends 200 good
traces is 200 "observations" and can decide an experiment that 30 other users show nothing in; counted per user, that
user is one observation, the mean of their scored traces (`ArmScores.of_users`). The estimate is then the difference
of the average user's mean score, each user weighing one, and `MIN_PER_ARM`, `OPTIMAL_AT` and `users_needed` count
users. The theorem takes each unit's value as fixed once seen, where a user's mean is revised as their later traces
arrive; users stay independent of each other and each mean stays in [0, 1], but that revision is outside the
theorem, so bench/ab_users.py measures it: A/A experiments with users who come back, read daily.

Scores are in [0, 1] (TraceIn refuses others; thumbs are 0 or 1), so a user's mean is too. The theorem is asymptotic,
and a few users can all agree (a sample variance of 0 would make the interval a point), so each arm's variance is
shrunk toward 1/4, the largest a value in [0, 1] can have, by `PRIOR_USERS` pseudo-users, and no verdict is given
before `MIN_PER_ARM` users with a scored trace in each arm; both fade as users arrive. bench/ab_peeking.py measures
what this keeps (each simulated unit one user): A/A experiments read daily for 30 days, and the power.

Pure functions over numbers or numpy arrays (the benchmark runs thousands of experiments through these same calls).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

ALPHA = 0.05
OPTIMAL_AT = 500  # users (both arms) where the sequence is tightest: a few weeks of a small agent's traffic
PRIOR_USERS = 2.0  # pseudo-users of the largest variance (1/4) added to each arm's variance
MIN_PER_ARM = 10  # users with a scored trace each arm needs before any verdict
MAX_VARIANCE = 0.25  # of a score (or a user's mean score) in [0, 1]
POWER = 0.8  # the chance `users_needed` aims for


def mixture_rho2(optimal_at: float = OPTIMAL_AT, alpha: float = ALPHA) -> float:
    """The mixture's rho² that makes the sequence narrowest after `optimal_at` units (exact, by Lambert's W).
    scipy is imported here and in `users_needed`, not with the module: the worker imports the A/B guard at start,
    and scipy.stats cost 0.6 s of CPU before every run's first call (issue 52, item 6)."""
    from scipy.special import lambertw

    return float((-lambertw(-alpha * alpha / math.e, k=-1).real - 1.0) / optimal_at)


def unit_margin(units, alpha: float = ALPHA, optimal_at: float = OPTIMAL_AT):
    """The half-width after `units` units for data of variance 1 (multiply by the standard deviation per unit)."""
    rho2 = mixture_rho2(optimal_at, alpha)
    t = np.asarray(units, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(2.0 * (t * rho2 + 1.0) / (t * t * rho2) * np.log(np.sqrt(t * rho2 + 1.0) / alpha))


def shrunk_variance(n, total, total_squares, prior: float = PRIOR_USERS):
    """An arm's variance from its count, sum and sum of squares of units, shrunk toward 1/4 by `prior` pseudo-units."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        squares = np.maximum(np.asarray(total_squares, dtype=float) - np.asarray(total, dtype=float) ** 2 / n, 0.0)
        squares = np.where(n > 0, squares, 0.0)
        return (squares + prior * MAX_VARIANCE) / np.maximum(n - 1.0 + prior, 1e-12)


def difference_bounds(n_a, mean_a, var_a, n_b, mean_b, var_b, alpha: float = ALPHA,
                      optimal_at: float = OPTIMAL_AT):
    """(difference, low, high) of mean_b − mean_a: the confidence sequence at this moment. Elementwise on arrays;
    NaN bounds where an arm has fewer than MIN_PER_ARM units (no verdict yet)."""
    n_a, n_b = np.asarray(n_a, dtype=float), np.asarray(n_b, dtype=float)
    difference = np.asarray(mean_b, dtype=float) - np.asarray(mean_a, dtype=float)
    units = n_a + n_b
    with np.errstate(divide="ignore", invalid="ignore"):
        per_unit = units * (np.asarray(var_a, dtype=float) / n_a + np.asarray(var_b, dtype=float) / n_b)
        half = np.sqrt(per_unit) * unit_margin(units, alpha, optimal_at)
    half = np.where((n_a >= MIN_PER_ARM) & (n_b >= MIN_PER_ARM), half, np.nan)
    return difference, difference - half, difference + half


def excludes_zero(low, high):
    """Whether the interval says the arms differ (NaN bounds: no verdict, False)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return (low > 0) | (high < 0)


@dataclass(frozen=True)
class ArmScores:
    """One arm's units as the verdict needs them: count `n` (users), mean and (shrunk) variance; `traces` is how many
    scored traces those units' values came from (shown beside `n`, never counted as units)."""

    n: int
    mean: float | None
    variance: float
    traces: int = 0

    @classmethod
    def of(cls, values: Sequence[float]) -> ArmScores:
        """Each value one unit (in the studio: one user's mean score)."""
        n = len(values)
        total = float(sum(values))
        squares = float(sum(value * value for value in values))
        return cls(n, total / n if n else None, float(shrunk_variance(n, total, squares)), n)

    @classmethod
    def of_users(cls, by_user: Mapping[str, Sequence[float]]) -> ArmScores:
        """One unit per user with a scored trace: the mean of that user's scores (see the module's note)."""
        means = [sum(scores) / len(scores) for scores in by_user.values() if scores]
        return replace(cls.of(means), traces=sum(len(scores) for scores in by_user.values()))


@dataclass(frozen=True)
class Verdict:
    """The candidate's difference from production and its anytime-valid interval; `decided` only when the interval
    excludes zero. `low`/`high` are None before each arm has MIN_PER_ARM users."""

    difference: float | None
    low: float | None
    high: float | None
    decided: bool
    alpha: float = ALPHA

    @property
    def better(self) -> bool:
        return self.decided and self.low is not None and self.low > 0

    @property
    def worse(self) -> bool:
        return self.decided and self.high is not None and self.high < 0


def verdict(production: ArmScores, candidate: ArmScores, alpha: float = ALPHA,
            optimal_at: float = OPTIMAL_AT) -> Verdict:
    """The studio's A/B verdict on two arms' scores (the function bench/ab_peeking.py measures, vectorised)."""
    if not production.n or not candidate.n:
        return Verdict(None, None, None, False, alpha)
    difference, low, high = difference_bounds(production.n, production.mean, production.variance, candidate.n,
                                              candidate.mean, candidate.variance, alpha, optimal_at)
    if math.isnan(float(low)):
        return Verdict(float(difference), None, None, False, alpha)
    return Verdict(float(difference), float(low), float(high), bool(excludes_zero(low, high)), alpha)


def users_needed(production: ArmScores, candidate: ArmScores, effect: float, *, candidate_share: float,
                 alpha: float = ALPHA, optimal_at: float = OPTIMAL_AT, power: float = POWER,
                 cap: int = 10_000_000) -> int | None:
    """How many more users with a scored trace (both arms together, split as now) until a true difference of `effect`
    would be declared with probability about `power`: the smallest total where the interval's half-width plus the
    estimate's own spread at that power fits inside `effect`. None when not even `cap` users would do."""
    if effect <= 0:
        raise ValueError("the difference to detect must be above 0")
    have = production.n + candidate.n
    share = candidate.n / have if production.n and candidate.n else candidate_share
    share = min(max(share, 1e-3), 1 - 1e-3)
    from scipy.stats import norm

    z = float(norm.ppf(power))

    def enough(total: int) -> bool:
        n_a, n_b = max(total * (1 - share), 1.0), max(total * share, 1.0)
        if min(n_a, n_b) < MIN_PER_ARM:
            return False
        spread = math.sqrt(production.variance / n_a + candidate.variance / n_b)
        return spread * (math.sqrt(total) * float(unit_margin(total, alpha, optimal_at)) + z) <= effect

    high = max(have, 2)
    while not enough(high):
        if high >= cap:
            return None
        high = min(high * 2, cap)
    low = max(have, 1) - 1
    while high - low > 1:  # enough(high) holds and enough(low) does not (or low is below what is already here)
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return max(high - have, 0)
