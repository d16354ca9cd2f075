"""The metrics of one GRPO-MA training step: what the rollout, the rewards and the update did, over all ranks.

Per-rank numbers are averaged over ranks. The reward mean and std are taken over every finite reward of every
rank (ranks may hold different numbers of them); non-finite rewards are counted (``reward/non_finite``) and
warned about once per step on rank 0.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vlm_grpoma.algorithm import thought_advantage_variance
from vlm_grpoma.algorithm.advantages import thought_values
from vlm_grpoma.algorithm.allocation import TwoPhaseValues
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logging import reduce_metrics, sum_over_ranks

log = logging.getLogger(__name__)


class PhaseTimer:
    """Wall-clock seconds of a step's phases: ``with timer("rollout"): ...`` then ``timer.seconds["rollout"]``
    (a phase timed twice, e.g. a refill rollout, adds up)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - began

    def metrics(self) -> dict[str, float]:
        """``time/<phase>_s`` for every timed phase."""
        return {f"time/{phase}_s": seconds for phase, seconds in self.seconds.items()}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def rollout_metrics(tree: RolloutTree, rollout_seconds: float) -> dict[str, float]:
    """Lengths, truncation rates and sampling throughput of this rank's rollout tree."""
    sampled_tokens = float(tree.thought_mask.sum() + tree.answer_mask.sum())
    present = tree.present  # the answers sampled (a ragged tree's absent slots are not answers)
    return {
        "lengths/thought_mean": float(tree.thought_lengths.float().mean()),
        "lengths/answer_mean": float(tree.answer_lengths[present].float().mean()),
        "truncation/thought_rate": float(tree.thought_truncated.float().mean()),
        "truncation/answer_rate": float(tree.answer_truncated[present].float().mean()),
        "tokens_per_s": sampled_tokens / max(rollout_seconds, 1e-9),
    }


def zero_thought_variance_fraction(rewards: torch.Tensor, values: torch.Tensor | None = None) -> float:
    """The fraction of prompts with fewer than two distinct finite thought values (no thought signal); the
    values are the thoughts' mean rewards unless given."""
    per_thought = thought_values(rewards) if values is None else values
    has_value = torch.isfinite(per_thought)
    highest = per_thought.where(has_value, -math.inf).amax(-1)
    lowest = per_thought.where(has_value, math.inf).amin(-1)
    return float((highest <= lowest).float().mean())


def reward_metrics(
    rewards: torch.Tensor,
    parsed: torch.Tensor,
    result: RewardResult,
    answer_present: torch.Tensor | None = None,
    two_phase: TwoPhaseValues | None = None,
) -> dict[str, float]:
    """This rank's parse rate, group signal, thought-advantage variance estimate and reward components
    (``answer_present``: a ragged tree's sampled answers, the others not counted; ``two_phase``: its thought
    values, as the advantages take them)."""
    present = torch.ones_like(parsed) if answer_present is None else answer_present
    values = None if two_phase is None else two_phase.values(rewards, present)
    estimate = thought_advantage_variance(rewards, answer_present, two_phase)
    metrics = {
        "answers/parse_rate": float(parsed[present].float().mean()),
        "groups/zero_thought_variance": zero_thought_variance_fraction(rewards, values),
        "variance/thought_adv_estimate": float(estimate.nanmean()),
    }
    for name, component in result.components.items():
        metrics[f"reward/{name}_mean"] = float(torch.tensor(component, dtype=torch.float64).nanmean())
    return metrics


def global_reward_metrics(
    rewards: torch.Tensor, failures: dict[str, float], timeout_s: float, step: int, is_main: bool
) -> dict[str, float]:
    """Reward mean/std over every finite reward of every rank, the non-finite count (warned about on rank 0)
    and the answers' failure reasons summed over ranks."""
    finite = torch.isfinite(rewards)
    values = rewards[finite]
    sums = reduce_metrics(
        {
            "n": float(values.numel()),
            "sum": float(values.sum()),
            "sq": float((values.double() ** 2).sum()),
            "non_finite": float((~finite).sum()),
        },
        "sum",
        timeout_s,
    )
    count = sums["n"]
    mean = sums["sum"] / count if count else math.nan
    metrics = {
        "reward/total_mean": mean,
        "reward/total_std": math.sqrt(max(sums["sq"] / count - mean**2, 0.0)) if count else math.nan,
        "reward/non_finite": sums["non_finite"],
    }
    metrics.update({f"failures/{k}": float(v) for k, v in sum_over_ranks(failures, timeout_s).items()})
    if sums["non_finite"] and is_main:
        log.warning(
            "step %d: %d answer(s) got a non-finite reward; they were left out of their groups' statistics "
            "with advantage 0 (reward/non_finite)",
            step,
            int(sums["non_finite"]),
        )
    return metrics
