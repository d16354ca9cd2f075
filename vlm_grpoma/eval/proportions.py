"""Confidence statements about success rates: a Wilson interval for one rate, and for the change of a rate
between two policies run on the same episodes, Newcombe's square-and-add interval with an exact McNemar test.

Held-out sets here hold tens of episodes, so a rate moves by 1.5 points per episode; these numbers say how
much of a change is more than that noise. Newcombe (1998), "Improved confidence intervals for the difference
between binomial proportions based on paired data", Statistics in Medicine 17: 2635-2650, method 10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import binomtest


@dataclass(frozen=True)
class Rate:
    """``successes`` of ``trials`` with its 95 % Wilson score interval [low, high]."""

    successes: int
    trials: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.successes / self.trials


def wilson(successes: int, trials: int, confidence: float = 0.95) -> Rate:
    """The rate ``successes / trials`` with its Wilson score interval (``trials`` must be positive)."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes} of {trials}")
    ci = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="wilson")
    return Rate(successes, trials, float(ci.low), float(ci.high))


@dataclass(frozen=True)
class PairedChange:
    """The change of a success rate from ``before`` to ``after`` on the same episodes.

    ``gained``: episodes failed before and solved after; ``lost``: the reverse. ``low``/``high``: Newcombe's
    interval for ``after - before``; ``p_value``: exact two-sided McNemar test of "no change"."""

    before: Rate
    after: Rate
    gained: int
    lost: int
    low: float
    high: float
    p_value: float

    @property
    def difference(self) -> float:
        return self.after.value - self.before.value


def _correlation(both: int, gained: int, lost: int, neither: int) -> float:
    """Newcombe's continuity-corrected phi between the two outcomes (0 when a margin is empty)."""
    n = both + gained + lost + neither
    after_yes, after_no = both + gained, lost + neither
    before_yes, before_no = both + lost, gained + neither
    if 0 in (after_yes, after_no, before_yes, before_no):
        return 0.0
    cross = both * neither - gained * lost
    if cross > n / 2:
        cross -= n / 2
    elif cross >= 0:
        cross = 0.0
    return cross / math.sqrt(after_yes * after_no * before_yes * before_no)


def paired_change(before: Sequence[bool], after: Sequence[bool], confidence: float = 0.95) -> PairedChange:
    """Compare two policies' outcomes on the same episodes (``before[i]`` and ``after[i]`` of episode i)."""
    if len(before) != len(after) or not before:
        raise ValueError(f"need the same non-zero number of episodes, got {len(before)} and {len(after)}")
    pairs = list(zip(map(bool, before), map(bool, after)))
    both = sum(b and a for b, a in pairs)
    gained = sum(a and not b for b, a in pairs)
    lost = sum(b and not a for b, a in pairs)
    neither = len(pairs) - both - gained - lost
    rate_before = wilson(both + lost, len(pairs), confidence)
    rate_after = wilson(both + gained, len(pairs), confidence)
    phi = _correlation(both, gained, lost, neither)
    p1, l1, u1 = rate_after.value, rate_after.low, rate_after.high
    p2, l2, u2 = rate_before.value, rate_before.low, rate_before.high
    delta = p1 - p2
    low = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    high = delta + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    discordant = gained + lost
    p_value = binomtest(gained, discordant).pvalue if discordant else 1.0
    return PairedChange(rate_before, rate_after, gained, lost, low, high, float(p_value))
