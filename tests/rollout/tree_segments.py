"""Test helper: a rollout tree cut into teacher-forcing segments (tokens to score after their context), the
independent reference the rollout tests rebuild full forwards and contexts from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from vlm_grpoma.rollout.tree import RolloutTree


@dataclass
class Segment:
    """One training segment: ``tokens`` [T] to score given ``context`` [C] (ids only; images via prompt_index)."""

    prompt_index: int
    thought_index: int
    answer_index: int | None
    context: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor


def thought_segments(tree: RolloutTree) -> Iterator[Segment]:
    """B·K segments: thought tokens in the context of the prompt (order b, k)."""
    b_, k_, _ = tree.shape
    for b in range(b_):
        for k in range(k_):
            mask = tree.thought_mask[b, k]
            yield Segment(
                b,
                k,
                None,
                tree.prompts[b].input_ids,
                tree.thought_ids[b, k][mask],
                tree.thought_logprobs[b, k][mask],
            )


def answer_segments(tree: RolloutTree) -> Iterator[Segment]:
    """B·K·M segments: answer tokens in the context of prompt + thought (order b, k, m)."""
    b_, k_, m_ = tree.shape
    for b in range(b_):
        for k in range(k_):
            context = torch.cat([tree.prompts[b].input_ids, tree.thought_tokens(b, k)])
            for m in range(m_):
                mask = tree.answer_mask[b, k, m]
                yield Segment(
                    b, k, m, context, tree.answer_ids[b, k, m][mask], tree.answer_logprobs[b, k, m][mask]
                )
