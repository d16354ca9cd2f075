"""A few completions of a training step with their rewards, for reading a run (``samples.jsonl``, TensorBoard)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rollout.tree import RolloutTree


def completion_samples(
    tree: RolloutTree, records: Sequence[Record], result: RewardResult, parsed: Any, count: int
) -> list[dict[str, Any]]:
    """Up to ``count`` completions, first prompt first, one answer of each thought before a second answer of
    any (so the K different thoughts show), each with its total reward and every reward component.

    ``result`` and ``parsed`` are :func:`~vlm_grpoma.trainer.scoring.score_tree`'s: flat over (b, k, m) and
    ``[B, K, M]``."""
    b_count, k_count, m_count = tree.shape
    present = tree.present
    order = [
        (b, k, m) for b in range(b_count) for m in range(m_count) for k in range(k_count) if present[b, k, m]
    ]
    samples = []
    for b, k, m in order[:count]:
        flat = (b * k_count + k) * m_count + m
        samples.append(
            {
                "record": records[b].id,
                "prompt": records[b].prompt,
                "thought_index": k,
                "answer_index": m,
                "thought": tree.thought_texts[b][k],
                "answer": tree.answer_texts[b][k][m],
                "parsed": bool(parsed[b, k, m]),
                "reward": result.total[flat],
                "rewards": {name: values[flat] for name, values in result.components.items()},
            }
        )
    return samples


__all__ = ["completion_samples"]
