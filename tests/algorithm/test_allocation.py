"""Neyman allocation of the answer budget: exact totals, bounds, proportionality on hand examples, the shrunk
spread estimator against its formula, and uniform allocation when the thoughts' spreads are equal."""

import itertools

import pytest
import torch

from vlm_grpoma.algorithm.allocation import neyman_allocation, shrunk_reward_variance


def brute_force_optimum(variance, budget, low, high):
    """The integer allocation minimising Σ σ_k²/M_k within the bounds, by enumeration."""
    best = None
    for counts in itertools.product(range(low, high + 1), repeat=len(variance)):
        if sum(counts) == budget:
            cost = sum(v / m for v, m in zip(variance, counts))
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_totals_are_exact_bounds_hold_and_the_allocation_is_optimal(seed):
    gen = torch.Generator().manual_seed(seed)
    first = (torch.rand(8, 4, 3, generator=gen) < torch.rand(8, 4, 1, generator=gen)).double()
    budget, low, high = 20, 3, 9
    counts = neyman_allocation(first, budget=budget, min_per_thought=2, max_per_thought=high)
    assert counts.dtype == torch.int64 and counts.sum(-1).eq(budget).all()
    assert counts.min() >= low and counts.max() <= high
    variance = shrunk_reward_variance(first)
    for b in range(8):
        cost = (variance[b] / counts[b]).sum().item()
        assert cost == pytest.approx(brute_force_optimum(variance[b].tolist(), budget, low, high), rel=1e-12)


def test_neyman_proportionality_on_a_hand_example():
    """s² = (0.5, 0, 0, 0.5) from two first answers, pooled 0.25, ν = 2: σ̂² = (1/3, 1/6, 1/6, 1/3); 16 answers
    ∝ σ̂ = (0.577, 0.408, 0.408, 0.577) is (4.69, 3.31, 3.31, 4.69), rounded (5, 3, 3, 5)."""
    first = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]])
    torch.testing.assert_close(
        shrunk_reward_variance(first), torch.tensor([[1 / 3, 1 / 6, 1 / 6, 1 / 3]], dtype=torch.float64)
    )
    counts = neyman_allocation(first, budget=16, min_per_thought=2, max_per_thought=12)
    assert counts.tolist() == [[5, 3, 3, 5]]
    # raw spreads σ = (√2, √18) ∝ 1 : 3 kept as they are (ν → 0): 8 answers split (2, 6), Neyman exactly
    exact = torch.tensor([[[0.0, 2.0], [0.0, 6.0]]])
    counts = neyman_allocation(exact, budget=8, min_per_thought=1, max_per_thought=8, prior_dof=1e-9)
    assert counts.tolist() == [[2, 6]]


def test_bounds_cap_the_largest_spread_and_the_rest_is_proportional():
    first = torch.tensor([[[0.0, 10.0], [0.0, 1.0], [0.0, 2.0]]])  # σ ∝ 10 : 1 : 2
    counts = neyman_allocation(first, budget=16, min_per_thought=2, max_per_thought=10, prior_dof=1e-9)
    assert counts.tolist() == [[10, 2, 4]]


def test_shrinkage_formula_with_unusable_and_short_thoughts():
    first = torch.tensor([[[1.0, 3.0, 5.0], [2.0, 2.0, torch.nan], [torch.inf, 4.0, torch.nan]]])
    # s² = 4 (d=2), 0 (d=1), no information (d=0); pooled over the informative ones = 2; ν = 3
    expected = torch.tensor([[(2 * 4 + 3 * 2) / 5, (1 * 0 + 3 * 2) / 4, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(shrunk_reward_variance(first, prior_dof=3.0), expected)


def test_a_thought_whose_first_answers_agree_is_not_starved():
    first = torch.tensor([[[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    counts = neyman_allocation(first, budget=24, min_per_thought=2, max_per_thought=16)
    assert counts[0, 0] > 2  # raw s² = 0 would leave it at the floor


@pytest.mark.parametrize("budget", [16, 18, 23])
def test_equal_spreads_allocate_uniformly_with_the_remainder_to_the_first_thoughts(budget):
    agree = torch.ones(2, 4, 2)  # all spreads 0
    same = torch.tensor([0.0, 1.0]).expand(2, 4, 2)  # all spreads equal, nonzero
    expected = [budget // 4 + (k < budget % 4) for k in range(4)]
    for first in (agree, same):
        counts = neyman_allocation(first, budget=budget, min_per_thought=2, max_per_thought=8)
        assert counts.tolist() == [expected, expected]


def test_infeasible_budgets_and_too_few_first_answers_are_refused():
    with pytest.raises(ValueError, match="budget 7 cannot be split over 4 thoughts"):
        neyman_allocation(torch.zeros(1, 4, 2), budget=7, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="budget 17 cannot be split"):
        neyman_allocation(torch.zeros(1, 4, 2), budget=17, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="at least 2 first answers"):
        neyman_allocation(torch.zeros(1, 4, 1), budget=8, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="prior_dof"):
        shrunk_reward_variance(torch.zeros(1, 4, 2), prior_dof=0.0)


def test_predicted_variance_ratio_against_the_written_sums():
    from vlm_grpoma.algorithm.allocation import allocate_answers, predicted_variance_ratio

    variance = torch.tensor(
        [[4.0, 1.0, 1.0, 0.25], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    counts = allocate_answers(variance, budget=16, min_per_thought=2, max_per_thought=8)
    ratio = predicted_variance_ratio(variance, counts)
    expected = (variance[0] / counts[0]).sum() / (variance[0] / 4).sum()
    assert float(ratio[0]) == pytest.approx(float(expected), rel=1e-12) and ratio[0] < 1
    assert float(ratio[1]) == 1.0  # equal spreads: the uniform split itself
    assert ratio[2].isnan()  # no spread: nothing to predict
