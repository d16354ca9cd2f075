"""The reward step of training: parse every sampled answer of a rollout tree and score it with the rewards.

Shared by the GRPO-MA step (rewards for advantages) and the held-out evaluation (greedy answers' scores).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlm_grpoma.algorithm.advantages import usable_rewards
from vlm_grpoma.answers import ParseError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards import Completion
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rollout.tree import RolloutTree


def score_tree(
    tree: RolloutTree, records: Sequence[Record], adapter, rewards
) -> tuple[RewardResult, torch.Tensor, torch.Tensor]:
    """Parse every answer (thought + answer text: a real vocabulary may split a tag across them) and score it.

    Returns the reward result, the total rewards as ``[B, K, M]`` (:func:`reward_tensor`) and which answers
    parsed (``[B, K, M]`` bool).
    """
    b_count, k_count, m_count = tree.shape
    texts = tree.completions()
    completions, owners = [], []
    for b, record in enumerate(records):
        for k in range(k_count):
            for m in range(m_count):
                answer = adapter.parse_answer(texts[b][k][m], record)
                completions.append(
                    Completion(
                        answer, tree.thought_texts[b][k], tree.answer_texts[b][k][m], adapter.thought.opened
                    )
                )
                owners.append(record)
    result = rewards.score(completions, owners)
    parsed = torch.tensor([not isinstance(c.answer, ParseError) for c in completions], dtype=torch.bool)
    shape = (b_count, k_count, m_count)
    return result, reward_tensor(result.total, shape), parsed.view(shape)


def reward_tensor(totals: Sequence[float], shape: tuple[int, ...]) -> torch.Tensor:
    """Total rewards as a float64 tensor of ``shape``; ±inf and a reward too large for float64 statistics
    (beyond ``MAX_REWARD_MAGNITUDE``, see :mod:`~vlm_grpoma.algorithm.advantages`) become NaN: no signal,
    counted in ``reward/non_finite``.

    float32 overflowed beyond ~1e19 (the squares in the group std), giving zero or NaN advantages silently.
    """
    rewards = torch.tensor(totals, dtype=torch.float64).view(shape)
    return rewards.masked_fill(~usable_rewards(rewards), torch.nan)
