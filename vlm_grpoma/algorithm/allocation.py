"""Neyman allocation of a prompt's answer budget over its K thoughts, from the rewards of their first answers,
and the thought values that stay unbiased under it.

**Values.** The first ``f`` answers of a thought both choose its answer count and are data of its value, so
the plain mean of all its answers is biased: a thought whose first answers agree gets few extra answers, and
its value stays near those extremes (Bernoulli p = 0.9, 2 first answers of a 16-answer budget: +0.017). Given
the first answers, the ``e_k`` extra answers are fresh draws, so their mean ``E_k`` is unbiased whatever
``e_k ≥ 1`` the allocation chose, and so is the fixed-weight mix :class:`TwoPhaseValues`
``V_k = w·F_k + (1 − w)·E_k`` of it and the first answers' mean ``F_k`` (``w`` fixed before sampling:
``f / (budget / K)``, the first answers' share of the uniform split, which makes ``V_k`` the plain mean when the
split is uniform). Its answer-sampling variance is ``σ_k² (w²/f + (1 − w)²/e_k)``. A thought that gets no extra
answer while another does would be valued by ``F_k`` alone, a choice made by its own first answers: biased
again, so the allocation gives every thought at least one extra answer whenever there are extras at all.

**Allocation.** The value variance depends on the allocation through ``Σ_k σ_k² / e_k`` only, smallest under
``Σ_k e_k = budget − K·f`` at Neyman's ``e_k ∝ σ_k``. Within the bounds
``max(1, min_per_thought − f) ≤ e_k ≤ max_per_thought − f`` the integer optimum is reached greedily: starting
from the lower bound, each further answer goes to the thought whose variance it lowers most,
``σ_k² / e_k − σ_k² / (e_k + 1)`` (exact for a separable convex objective), ties to the thought with fewer
answers, then to the lower index, so equal spreads give the uniform allocation (the first thoughts taking the
remainder when K does not divide the budget).

The spread σ_k is estimated from only ``first`` answers, so it is shrunk towards the prompt's pooled spread
(empirical Bayes, as limma's moderated variance): ``σ̂_k² = (d_k·s_k² + ν·s̄²) / (d_k + ν)`` with ``s_k²`` the
unbiased sample variance of the thought's usable first rewards, ``d_k`` its degrees of freedom (usable count
− 1), ``s̄²`` the mean of the prompt's ``s_k²`` and ``ν = prior_dof``. It is the posterior mean of σ_k² under a
scaled-inverse-χ² prior centred on s̄² with ν degrees of freedom. Without it, two Bernoulli(0.5) first
answers agree half the time, s_k² = 0, and the thought that needs answers most would get none beyond the
floor; with it, such a thought keeps ``ν/(d_k + ν)`` of the pooled spread. A thought without two usable first
rewards gets s̄² alone; a prompt whose thoughts all agree (s̄² = 0) is allocated uniformly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlm_grpoma.algorithm.advantages import thought_values, usable_rewards


@dataclass(frozen=True)
class TwoPhaseValues:
    """Thought values of a two-phase tree, ``V_k = w·F_k + (1 − w)·E_k`` (module docstring): ``first`` answers
    in each thought's first slots, the extra answers after them, ``first_weight`` = w."""

    first: int
    first_weight: float

    @classmethod
    def for_budget(cls, first: int, budget: int, thoughts: int) -> TwoPhaseValues:
        """w = the first answers' share of the uniform split ``budget / K`` (1: no extra answers)."""
        return cls(first, min(1.0, first * thoughts / budget))

    def values(self, rewards: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` float64 values of rewards ``[B, K, M]`` with present answers ``answer_mask``; a thought
        without a usable first (extra) reward is valued by its extra (first) answers alone, NaN without any."""
        x = rewards.double().where(answer_mask, torch.nan)
        first = thought_values(x[..., : self.first])
        if x.shape[-1] == self.first:
            return first
        extra = thought_values(x[..., self.first :])
        mixed = self.first_weight * first + (1.0 - self.first_weight) * extra
        return mixed.where(extra.isfinite(), first).where(first.isfinite(), extra)

    def variance_factor(self, counts: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` float64 ``Var(V_k) / σ_k²`` for ``counts`` answers per thought: ``w²/f + (1 − w)²/e_k``."""
        extra = (counts - self.first).double()
        later = ((1.0 - self.first_weight) ** 2 / extra.clamp(min=1.0)).where(extra > 0, 0.0)
        return self.first_weight**2 / self.first + later


def shrunk_reward_variance(first_rewards: torch.Tensor, *, prior_dof: float = 2.0) -> torch.Tensor:
    """``[B, K]`` float64 shrunk within-thought reward variance σ̂_k² from first rewards ``[B, K, first]``."""
    if first_rewards.dim() != 3:
        raise ValueError(f"first_rewards must have shape [B, K, first], got {tuple(first_rewards.shape)}")
    if prior_dof <= 0:
        raise ValueError(f"prior_dof must be > 0, got {prior_dof}")
    x = first_rewards.double()
    usable = usable_rewards(x)
    count = usable.sum(dim=-1).double()
    mean = x.where(usable, 0.0).sum(dim=-1) / count.clamp(min=1.0)
    squares = ((x - mean.unsqueeze(-1)).where(usable, 0.0) ** 2).sum(dim=-1)
    dof = (count - 1.0).clamp(min=0.0)
    sample_var = squares / dof.clamp(min=1.0)
    informative = dof > 0
    pooled = sample_var.where(informative, 0.0).sum(dim=-1, keepdim=True) / informative.sum(
        dim=-1, keepdim=True
    ).clamp(min=1)
    return (dof * sample_var + prior_dof * pooled) / (dof + prior_dof)


def neyman_allocation(
    first_rewards: torch.Tensor,
    *,
    budget: int,
    min_per_thought: int,
    max_per_thought: int,
    prior_dof: float = 2.0,
) -> torch.Tensor:
    """``[B, K]`` int64 answers per thought (first answers included), summing to ``budget`` for every prompt,
    from the first answers' rewards ``[B, K, first]``: Neyman's split of the extra answers, at least one per
    thought when there are any (module docstring)."""
    if first_rewards.dim() != 3 or first_rewards.shape[-1] < 2:
        raise ValueError(
            f"first_rewards must have shape [B, K, first] with at least 2 first answers per thought, got "
            f"{tuple(first_rewards.shape)}"
        )
    thoughts, first = first_rewards.shape[1:]
    low, high = extra_answer_bounds(first, budget, thoughts, min_per_thought, max_per_thought)
    extra = allocate_answers(
        shrunk_reward_variance(first_rewards, prior_dof=prior_dof),
        budget=budget - thoughts * first,
        min_per_thought=low,
        max_per_thought=high,
    )
    return first + extra


def extra_answer_bounds(
    first: int, budget: int, thoughts: int, min_per_thought: int, max_per_thought: int
) -> tuple[int, int]:
    """Fewest and most extra answers per thought: at least one each when ``budget`` leaves any extras (for
    unbiased values, module docstring); ``ValueError`` naming the totals when ``budget`` cannot be split so."""
    extras = budget - thoughts * first
    low = max(min_per_thought - first, 1 if extras else 0)
    high = max_per_thought - first
    if not thoughts * low <= extras <= thoughts * high:
        raise ValueError(
            f"budget {budget} cannot be split over {thoughts} thoughts as {first} first answers each and then "
            f"{low}..{max(high, 0)} more each (one at least, when there are more, keeps the values unbiased)"
        )
    return low, high


def allocate_answers(
    variance: torch.Tensor, *, budget: int, min_per_thought: int, max_per_thought: int
) -> torch.Tensor:
    """``[B, K]`` int64 integer minimiser of ``Σ_k variance_k / M_k`` with ``Σ_k M_k = budget`` within the
    bounds, greedily with the module docstring's tie-break (for known spreads: Neyman's allocation)."""
    batch, thoughts = variance.shape
    if not thoughts * min_per_thought <= budget <= thoughts * max_per_thought:
        raise ValueError(
            f"budget {budget} cannot be split over {thoughts} thoughts with {min_per_thought}..{max_per_thought} "
            "answers each"
        )
    variance = variance.double()
    counts = torch.full((batch, thoughts), min_per_thought, dtype=torch.int64)
    rows = torch.arange(batch)
    order = torch.arange(thoughts, dtype=torch.float64)
    for _ in range(budget - thoughts * min_per_thought):
        gain = variance / (counts * (counts + 1)).double()
        gain = gain.masked_fill(counts >= max_per_thought, -torch.inf)
        best = gain.amax(dim=-1, keepdim=True)
        # among the thoughts of largest gain: the fewest answers, then the lowest index
        tie_key = (counts.double() * thoughts + order).masked_fill(gain < best, torch.inf)
        counts[rows, tie_key.argmin(dim=-1)] += 1
    return counts


def predicted_variance_ratio(
    variance: torch.Tensor, counts: torch.Tensor, two_phase: TwoPhaseValues
) -> torch.Tensor:
    """``[B]`` float64 predicted answer-sampling variance ``Σ_k σ̂_k² Var(V_k)/σ_k²`` of the two-phase values
    under the realised allocation ``counts [B, K]`` over the plain mean's ``Σ_k σ̂_k² / M̄`` at the uniform split
    ``M̄ = Σ_k M_k / K`` (≤ 1 for Neyman's allocation when K divides the budget); NaN where every σ̂_k² is 0."""
    variance, total = variance.double(), counts.double()
    uniform = total.sum(-1, keepdim=True) / total.shape[-1]
    realised = (variance * two_phase.variance_factor(counts)).sum(-1)
    baseline = (variance / uniform.clamp(min=1.0)).sum(-1)
    return (realised / baseline).where(baseline > 0, torch.nan)
