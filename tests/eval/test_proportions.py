"""Success-rate intervals: Wilson against its closed form, Newcombe's paired interval against a textbook
example, the McNemar test against its binomial definition."""

import math

import pytest
from scipy.stats import binom

from vlm_grpoma.eval.proportions import paired_change, wilson

Z95 = 1.959963984540054


def wilson_closed_form(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 / (1 + Z95**2 / n) * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n**2))
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(0, 64), (1, 64), (34, 64), (58, 64), (64, 64), (3, 7)])
def test_wilson_matches_the_closed_form(k, n):
    rate = wilson(k, n)
    low, high = wilson_closed_form(k, n)
    assert rate.value == k / n
    assert rate.low == pytest.approx(max(low, 0.0), abs=1e-9)
    assert rate.high == pytest.approx(min(high, 1.0), abs=1e-9)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        wilson(5, 4)
    with pytest.raises(ValueError, match="trials > 0"):
        wilson(0, 0)


def outcomes(both: int, gained: int, lost: int, neither: int) -> tuple[list[bool], list[bool]]:
    before = [True] * both + [False] * gained + [True] * lost + [False] * neither
    after = [True] * both + [True] * gained + [False] * lost + [False] * neither
    return before, after


def test_newcombe_interval_matches_the_textbook_example():
    """Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), chapter 8: complete
    response before and after consolidation therapy (Cavo et al. 2012), table [[59, 6], [16, 80]]; the
    Newcombe square-and-add interval is -0.0621 (-0.1186 to -0.0046)."""
    change = paired_change(*outcomes(both=59, gained=6, lost=16, neither=80))
    assert change.difference == pytest.approx(-0.0621, abs=5e-5)
    assert change.low == pytest.approx(-0.1186, abs=5e-5)
    assert change.high == pytest.approx(-0.0046, abs=5e-5)
    assert (change.gained, change.lost, change.after.trials) == (6, 16, 161)


def test_mcnemar_p_value_is_the_two_sided_binomial_tail_of_the_discordant_pairs():
    change = paired_change(*outcomes(both=20, gained=25, lost=2, neither=17))
    tail = binom.cdf(2, 27, 0.5)
    assert change.p_value == pytest.approx(2 * tail, rel=1e-9)
    assert change.difference == pytest.approx(23 / 64)
    assert change.low > 0  # 25 gained against 2 lost over 64 episodes is far beyond noise


def test_no_discordant_pair_means_no_evidence_of_change():
    change = paired_change([True, False, True], [True, False, True])
    assert (change.difference, change.p_value, change.gained, change.lost) == (0.0, 1.0, 0, 0)
    assert change.low < 0 < change.high


def test_paired_change_needs_the_same_episodes():
    with pytest.raises(ValueError, match="same non-zero number of episodes"):
        paired_change([True], [True, False])
