"""The reward step of training: parse every sampled answer of a rollout tree and score it with the rewards.

Shared by the GRPO-MA step (rewards for advantages), the held-out evaluation (greedy answers' scores) and the
demo's per-episode evaluation; all of them read the parsed answers from its :class:`ScoredTree`.

In a ragged tree (adaptive answers) only the present answers are scored; an absent slot keeps its place in the
flat (b, k, m) order with :data:`ABSENT` as its answer, NaN as its total and components, and ``parsed`` False.
The first phase's scores and the extra answers' are joined by :func:`scores_with_answers`, not scored again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vlm_grpoma.algorithm.advantages import usable_rewards
from vlm_grpoma.answers import ParseError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards import Completion
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rollout.tree import RolloutTree

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rewards.base import Reward


#: the answer of an absent slot of a ragged tree (never scored)
ABSENT = ParseError("absent", "no answer was sampled in this slot")


@dataclass(frozen=True)
class ScoredTree:
    """Every sampled answer of a tree, parsed and scored: ``completions`` and ``result`` flat in (b, k, m)
    order (what the rewards saw and returned), ``rewards`` (:func:`reward_tensor`) and ``parsed`` (bool) as
    ``[B, K, M]``."""

    completions: list[Completion]
    result: RewardResult
    rewards: torch.Tensor
    parsed: torch.Tensor

    def index(self, b: int, k: int, m: int) -> int:
        """The flat position of answer (b, k, m) in ``completions`` and ``result``."""
        _, k_count, m_count = self.rewards.shape
        return (b * k_count + k) * m_count + m


def score_tree(
    tree: RolloutTree, records: Sequence[Record], adapter: QwenVLAdapter, rewards: Reward
) -> ScoredTree:
    """Parse every answer (thought + answer text: a real vocabulary may split a tag across them) and score it."""
    b_count, k_count, m_count = tree.shape
    texts, present = tree.completions(), tree.present
    completions, owners, slots = [], [], []
    for b, record in enumerate(records):
        for k in range(k_count):
            for m in range(m_count):
                if not present[b, k, m]:
                    completions.append(
                        Completion(ABSENT, tree.thought_texts[b][k], "", adapter.thought.opened)
                    )
                    continue
                answer = adapter.parse_answer(texts[b][k][m], record)
                slots.append(len(completions))
                completions.append(
                    Completion(
                        answer, tree.thought_texts[b][k], tree.answer_texts[b][k][m], adapter.thought.opened
                    )
                )
                owners.append(record)
    result = _placed(rewards.score([completions[i] for i in slots], owners), slots, len(completions))
    parsed = torch.tensor([not isinstance(c.answer, ParseError) for c in completions], dtype=torch.bool)
    shape = (b_count, k_count, m_count)
    return ScoredTree(completions, result, reward_tensor(result.total, shape), parsed.view(shape))


def _placed(result: RewardResult, slots: list[int], size: int) -> RewardResult:
    """``result`` (one entry per scored answer) spread to ``size`` flat slots, NaN at the unscored ones."""
    if len(slots) == size:
        return result

    def spread(values: Sequence[float]) -> list[float]:
        out = [math.nan] * size
        for slot, value in zip(slots, values, strict=True):
            out[slot] = value
        return out

    return RewardResult(
        spread(result.total), {n: spread(v) for n, v in result.components.items()}, dict(result.failures)
    )


def scores_with_answers(first: ScoredTree, extra: ScoredTree, tree: RolloutTree) -> ScoredTree:
    """The scores of ``tree`` = ``first``'s tree ``.with_answers(extra's tree)``, from the two phases' scores:
    ``first`` uniform (M₁ answers per thought), then each thought's scored ``extra`` answers (present first)."""
    first_m = first.rewards.shape[2]
    extra_present = torch.tensor([c.answer is not ABSENT for c in extra.completions]).view(
        extra.rewards.shape
    )
    if not torch.equal(tree.answer_counts, first_m + extra_present.sum(-1)):
        raise ValueError("scores_with_answers: the tree's answers are not the two phases' answers")
    b_count, k_count, m_count = tree.shape
    opened = first.completions[0].thought_opened
    completions, sources = [], []  # sources: (phase's ScoredTree, flat index), None for an absent slot
    for b in range(b_count):
        for k in range(k_count):
            for m in range(m_count):
                if m < first_m:
                    source = (first, first.index(b, k, m))
                elif tree.present[b, k, m]:
                    source = (extra, extra.index(b, k, m - first_m))
                else:
                    source = None
                sources.append(source)
                completions.append(
                    Completion(ABSENT, tree.thought_texts[b][k], "", opened)
                    if source is None
                    else source[0].completions[source[1]]
                )

    def joined(values: Callable[[ScoredTree], Sequence[float]]) -> list[float]:
        return [math.nan if s is None else values(s[0])[s[1]] for s in sources]

    failures = dict(first.result.failures)
    for reason, count in extra.result.failures.items():
        failures[reason] = failures.get(reason, 0) + count
    result = RewardResult(
        joined(lambda scored: scored.result.total),
        {
            name: joined(lambda scored, n=name: scored.result.components[n])
            for name in first.result.components
        },
        failures,
    )
    parsed = torch.tensor([not isinstance(c.answer, ParseError) for c in completions], dtype=torch.bool)
    shape = (b_count, k_count, m_count)
    return ScoredTree(completions, result, reward_tensor(result.total, shape), parsed.view(shape))


def reward_tensor(totals: Sequence[float], shape: tuple[int, ...]) -> torch.Tensor:
    """Total rewards as a float64 tensor of ``shape``; ±inf and a reward too large for float64 statistics
    (beyond ``MAX_REWARD_MAGNITUDE``, see :mod:`~vlm_grpoma.algorithm.advantages`) become NaN: no signal,
    counted in ``reward/non_finite``.

    float32 overflowed beyond ~1e19 (the squares in the group std), giving zero or NaN advantages silently.
    """
    rewards = torch.tensor(totals, dtype=torch.float64).view(shape)
    return rewards.masked_fill(~usable_rewards(rewards), torch.nan)
