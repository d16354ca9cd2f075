"""Adaptive answers per thought (``rollout.adaptive_answers``): spend a prompt's answer budget where the
thought's value is least certain.

Phase 1 samples K thoughts with ``first`` answers each and scores them; Neyman allocation
(``algorithm/allocation.py``: shrunk spreads, per-thought bounds, at least one extra answer per thought) splits
the rest of ``budget``; the backend samples those answers continuing the same thoughts
(:meth:`RolloutEngine.sample_answers`) and they are scored. The result is a ragged tree of ``max_per_thought``
answer slots per thought, first answers first, and its scores, what the step trains on; its thought values are
``allocation.TwoPhaseValues``, unbiased under the allocation. The extra answers' seed is a function of the step's
rollout seed, so an exact resume resamples them alike.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

import torch

from vlm_grpoma.algorithm.allocation import (
    TwoPhaseValues,
    neyman_allocation,
    predicted_variance_ratio,
    shrunk_reward_variance,
)
from vlm_grpoma.config import AdaptiveAnswersConfig
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.base import RolloutEngine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.scoring import ScoredTree, scores_with_answers

#: mixes the step's rollout seed into the extra answers' (a large prime, as ``grpo_ma.sampling_seed``)
EXTRA_ANSWERS_SEED = 32_452_843


def two_phase_rollout(
    rollout: RolloutEngine,
    prompts: list[PromptInputs],
    params: SamplingParams,
    adaptive: AdaptiveAnswersConfig,
    score: Callable[[RolloutTree], ScoredTree],
    timed: Callable[[str], AbstractContextManager[None]],
) -> tuple[RolloutTree, ScoredTree]:
    """The ragged tree of ``prompts`` and its scores (module docstring); ``score`` scores a tree's present
    answers, ``timed(phase)`` times the ``rollout`` and ``reward`` phases."""
    with timed("rollout"):
        tree = rollout.sample(prompts, replace(params, answers_per_thought=adaptive.first))
    with timed("reward"):
        first = score(tree)
    counts = neyman_allocation(
        first.rewards,
        budget=adaptive.budget,
        min_per_thought=adaptive.min_per_thought,
        max_per_thought=adaptive.max_per_thought,
    )
    extra_params = replace(params, seed=(params.seed * 31 + EXTRA_ANSWERS_SEED) % (2**63 - 1))
    with timed("rollout"):
        extra_tree = rollout.sample_answers(tree, counts - adaptive.first, extra_params)
    with timed("reward"):
        extra = score(extra_tree)
    merged = tree.with_answers(extra_tree, adaptive.max_per_thought)
    return merged, scores_with_answers(first, extra, merged)


def allocation_metrics(
    tree: RolloutTree, rewards: torch.Tensor, two_phase: TwoPhaseValues
) -> dict[str, float]:
    """``answers/per_thought_{min,mean,max}`` of this rank's tree and ``answers/predicted_var_ratio``: the
    predicted answer-sampling variance of the two-phase values under the realised allocation (σ̂ from the
    first answers, as the allocation saw them) over the plain mean's at the uniform split, averaged over
    prompts with a spread (NaN: none)."""
    counts = tree.answer_counts
    first_spread = shrunk_reward_variance(rewards[:, :, : two_phase.first])
    ratio = predicted_variance_ratio(first_spread, counts, two_phase)
    return {
        "answers/per_thought_min": float(counts.min()),
        "answers/per_thought_mean": float(counts.double().mean()),
        "answers/per_thought_max": float(counts.max()),
        "answers/predicted_var_ratio": float(ratio.nanmean()),
    }


__all__ = ["allocation_metrics", "two_phase_rollout"]
