"""Neyman allocation of a prompt's answer budget over its K thoughts, from the rewards of their first answers.

The answer-sampling variance of thought k's value is ``σ_k² / M_k``; under ``Σ_k M_k = budget`` the sum
``Σ_k σ_k² / M_k`` is smallest at Neyman's ``M_k ∝ σ_k``. Within the bounds
``max(first, min_per_thought) ≤ M_k ≤ max_per_thought`` the integer optimum is reached greedily: starting from
the lower bound, each further answer goes to the thought whose variance it lowers most,
``σ_k² / M_k − σ_k² / (M_k + 1)`` (exact for a separable convex objective), ties to the thought with fewer
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

import torch

from vlm_grpoma.algorithm.advantages import usable_rewards


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
    from the first answers' rewards ``[B, K, first]`` (module docstring)."""
    if first_rewards.dim() != 3 or first_rewards.shape[-1] < 2:
        raise ValueError(
            f"first_rewards must have shape [B, K, first] with at least 2 first answers per thought, got "
            f"{tuple(first_rewards.shape)}"
        )
    return allocate_answers(
        shrunk_reward_variance(first_rewards, prior_dof=prior_dof),
        budget=budget,
        min_per_thought=max(first_rewards.shape[-1], min_per_thought),
        max_per_thought=max_per_thought,
    )


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


def predicted_variance_ratio(variance: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64 ``Σ_k σ̂_k²/M_k`` of the realised allocation ``counts [B, K]`` over the same sum at the
    uniform split ``M_k = Σ_k M_k / K`` (Jensen: ≤ 1 for Neyman's allocation); NaN where every σ̂_k² is 0."""
    variance, counts = variance.double(), counts.double()
    uniform = counts.sum(-1, keepdim=True) / counts.shape[-1]
    realised = (variance / counts.clamp(min=1.0)).sum(-1)
    baseline = (variance / uniform.clamp(min=1.0)).sum(-1)
    return (realised / baseline).where(baseline > 0, torch.nan)
