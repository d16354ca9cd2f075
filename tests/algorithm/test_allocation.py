"""Neyman allocation of the answer budget: exact totals, bounds, proportionality on hand examples, the shrunk
spread estimator against its formula, uniform allocation when the thoughts' spreads are equal, and the two-phase
thought values: their formula, and unbiasedness under the allocation by Monte-Carlo (the plain mean's bias
measured alongside)."""

import itertools

import pytest
import torch

from vlm_grpoma.algorithm.advantages import thought_values
from vlm_grpoma.algorithm.allocation import (
    TwoPhaseValues,
    allocate_answers,
    neyman_allocation,
    predicted_variance_ratio,
    shrunk_reward_variance,
)


def brute_force_optimum(variance, extras, low, high):
    """The integer split of ``extras`` answers minimising Σ σ_k²/e_k within the bounds, by enumeration."""
    best = None
    for counts in itertools.product(range(low, high + 1), repeat=len(variance)):
        if sum(counts) == extras:
            cost = sum(v / e for v, e in zip(variance, counts))
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_totals_are_exact_bounds_hold_and_the_extra_answers_split_is_optimal(seed):
    gen = torch.Generator().manual_seed(seed)
    first = (torch.rand(8, 4, 3, generator=gen) < torch.rand(8, 4, 1, generator=gen)).double()
    budget, high = 20, 9
    counts = neyman_allocation(first, budget=budget, min_per_thought=2, max_per_thought=high)
    assert counts.dtype == torch.int64 and counts.sum(-1).eq(budget).all()
    assert counts.min() >= 3 + 1 and counts.max() <= high  # every thought: its 3 first answers and 1 more
    variance = shrunk_reward_variance(first)
    for b in range(8):
        cost = (variance[b] / (counts[b] - 3)).sum().item()
        optimum = brute_force_optimum(variance[b].tolist(), budget - 12, 1, high - 3)
        assert cost == pytest.approx(optimum, rel=1e-12)


def test_neyman_proportionality_on_a_hand_example():
    """s² = (0.5, 0, 0, 0.5) from two first answers, pooled 0.25, ν = 2: σ̂² = (1/3, 1/6, 1/6, 1/3); the 16
    extra answers of a 24-answer budget ∝ σ̂ = (0.577, 0.408, 0.408, 0.577) are (4.69, 3.31, 3.31, 4.69),
    rounded (5, 3, 3, 5), so (7, 5, 5, 7) answers in all."""
    first = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]])
    torch.testing.assert_close(
        shrunk_reward_variance(first), torch.tensor([[1 / 3, 1 / 6, 1 / 6, 1 / 3]], dtype=torch.float64)
    )
    counts = neyman_allocation(first, budget=24, min_per_thought=2, max_per_thought=12)
    assert counts.tolist() == [[7, 5, 5, 7]]
    # raw spreads σ = (√2, √18) ∝ 1 : 3 kept as they are (ν → 0): 8 extra answers split (2, 6), Neyman exactly
    exact = torch.tensor([[[0.0, 2.0], [0.0, 6.0]]])
    counts = neyman_allocation(exact, budget=12, min_per_thought=1, max_per_thought=12, prior_dof=1e-9)
    assert counts.tolist() == [[4, 8]]


def test_bounds_cap_the_largest_spread_and_the_rest_is_proportional():
    """σ ∝ 10 : 1 : 2, 10 extra answers, at most 6 each: the first thought is capped at 6, the other 4 go
    (1, 3) — Σ σ²/e = 1 + 4/3 beats (2, 2)'s 1/2 + 2."""
    first = torch.tensor([[[0.0, 10.0], [0.0, 1.0], [0.0, 2.0]]])
    counts = neyman_allocation(first, budget=16, min_per_thought=2, max_per_thought=8, prior_dof=1e-9)
    assert counts.tolist() == [[8, 3, 5]]


def test_shrinkage_formula_with_unusable_and_short_thoughts():
    first = torch.tensor([[[1.0, 3.0, 5.0], [2.0, 2.0, torch.nan], [torch.inf, 4.0, torch.nan]]])
    # s² = 4 (d=2), 0 (d=1), no information (d=0); pooled over the informative ones = 2; ν = 3
    expected = torch.tensor([[(2 * 4 + 3 * 2) / 5, (1 * 0 + 3 * 2) / 4, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(shrunk_reward_variance(first, prior_dof=3.0), expected)


def test_a_thought_whose_first_answers_agree_is_not_starved():
    first = torch.tensor([[[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    counts = neyman_allocation(first, budget=24, min_per_thought=2, max_per_thought=16)
    assert counts[0, 0] > 3  # raw s² = 0 would leave it at the floor of one extra answer


@pytest.mark.parametrize("budget", [16, 18, 23])
def test_equal_spreads_allocate_uniformly_with_the_remainder_to_the_first_thoughts(budget):
    agree = torch.ones(2, 4, 2)  # all spreads 0
    same = torch.tensor([0.0, 1.0]).expand(2, 4, 2)  # all spreads equal, nonzero
    expected = [budget // 4 + (k < budget % 4) for k in range(4)]
    for first in (agree, same):
        counts = neyman_allocation(first, budget=budget, min_per_thought=2, max_per_thought=8)
        assert counts.tolist() == [expected, expected]


def test_a_budget_of_only_first_answers_allocates_nothing():
    counts = neyman_allocation(torch.rand(3, 4, 2), budget=8, min_per_thought=1, max_per_thought=4)
    assert counts.eq(2).all()


def test_infeasible_budgets_and_too_few_first_answers_are_refused():
    with pytest.raises(ValueError, match="budget 7 cannot be split over 4 thoughts as 2 first answers each"):
        neyman_allocation(torch.zeros(1, 4, 2), budget=7, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="budget 17 cannot be split"):
        neyman_allocation(torch.zeros(1, 4, 2), budget=17, min_per_thought=1, max_per_thought=4)
    # 10 = 8 first answers and 2 more: two thoughts would be valued by their first answers alone
    with pytest.raises(ValueError, match=r"budget 10 cannot be split .* then 1\.\.2 more each"):
        neyman_allocation(torch.zeros(1, 4, 2), budget=10, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="at least 2 first answers"):
        neyman_allocation(torch.zeros(1, 4, 1), budget=8, min_per_thought=1, max_per_thought=4)
    with pytest.raises(ValueError, match="prior_dof"):
        shrunk_reward_variance(torch.zeros(1, 4, 2), prior_dof=0.0)


def test_predicted_variance_ratio_against_the_written_sums():
    variance = torch.tensor(
        [[4.0, 1.0, 1.0, 0.25], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    counts = 2 + allocate_answers(variance, budget=8, min_per_thought=1, max_per_thought=6)
    two_phase = TwoPhaseValues.for_budget(2, 16, 4)  # w = 1/2
    ratio = predicted_variance_ratio(variance, counts, two_phase)
    extra = (counts[0] - 2).double()
    expected = (variance[0] * (0.25 / 2 + 0.25 / extra)).sum() / (variance[0] / 4).sum()
    assert float(ratio[0]) == pytest.approx(float(expected), rel=1e-12) and ratio[0] < 1
    assert float(ratio[1]) == 1.0  # equal spreads: the uniform split, where the values are the plain mean
    assert ratio[2].isnan()  # no spread: nothing to predict


def test_two_phase_values_against_the_written_formula():
    """w·(mean of the first answers) + (1 − w)·(mean of the present extra ones); a thought whose extra (first)
    rewards are all unusable falls back on its first (extra) ones; absent slots are not answers."""
    two_phase = TwoPhaseValues.for_budget(first=2, budget=12, thoughts=3)  # w = 2 / 4
    assert two_phase.first_weight == 0.5
    rewards = torch.tensor(
        [[[1.0, 0.0, 1.0, 1.0, 7.0], [0.0, 0.0, 1.0, 9.0, 9.0], [torch.nan, torch.nan, 0.5, 0.0, 9.0]]]
    )
    present = torch.tensor([[[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]], dtype=torch.bool)
    expected = [[0.5 * 0.5 + 0.5 * 1.0, 0.5 * 0.0 + 0.5 * 1.0, 0.25]]
    torch.testing.assert_close(
        two_phase.values(rewards, present), torch.tensor(expected, dtype=torch.float64)
    )
    rewards[0, 0, 2:4] = torch.inf  # no usable extra reward: the first answers' mean
    assert two_phase.values(rewards, present)[0, 0].item() == 0.5
    # no extra answers at all (budget = K x first): the plain mean, bit for bit
    only_first = TwoPhaseValues.for_budget(first=2, budget=6, thoughts=3)
    x = torch.rand(5, 3, 2, dtype=torch.float64)
    assert torch.equal(only_first.values(x, torch.ones_like(x, dtype=torch.bool)), thought_values(x))
    # a uniform split: the plain mean of all answers
    uniform = torch.rand(5, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(
        two_phase.values(uniform, torch.ones_like(uniform, dtype=torch.bool)), uniform.mean(-1)
    )
    factor = two_phase.variance_factor(torch.tensor([[3, 4, 6, 10]]))  # w²/2 + (1 − w)²/e: e = 1, 2, 4, 8
    torch.testing.assert_close(factor, torch.tensor([[0.375, 0.25, 0.1875, 0.15625]], dtype=torch.float64))


def test_two_phase_values_are_unbiased_under_the_allocation_where_the_plain_mean_is_not():
    """Bernoulli thoughts p = (0.1, 0.5, 0.9, 0.7), 2 first answers, 24 answers per prompt, at most 12 per
    thought, 20,000 prompts (at 16 answers the shrunk spreads of two first answers always split the 8 extra
    ones evenly). The plain mean of a thought's answers is pulled towards the extremes (its first answers
    choose how many more it gets); the two-phase values are not."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.5, 0.9, 0.7], dtype=torch.float64)
    draws, first, budget, high = 20_000, 2, 24, 12
    rewards = (torch.rand(draws, 4, high, generator=gen, dtype=torch.float64) < p.unsqueeze(-1)).double()
    counts = neyman_allocation(rewards[..., :first], budget=budget, min_per_thought=2, max_per_thought=high)
    present = torch.arange(high) < counts.unsqueeze(-1)  # answers are iid: a thought's M_k are its first M_k
    assert counts.amax().item() > counts.amin().item() + 2  # the allocation does move answers around
    values = TwoPhaseValues.for_budget(first, budget, 4).values(rewards, present)
    plain = thought_values(rewards.where(present, torch.nan))

    def bias_in_standard_errors(estimates: torch.Tensor) -> torch.Tensor:
        stderr = estimates.std(dim=0) / draws**0.5
        return (estimates.mean(dim=0) - p) / stderr

    assert bias_in_standard_errors(values).abs().max() < 4, bias_in_standard_errors(values)
    plain_bias = bias_in_standard_errors(plain)
    assert plain_bias[2] > 5 and plain_bias[0] < -5, plain_bias  # p = 0.9 pulled up, p = 0.1 down
