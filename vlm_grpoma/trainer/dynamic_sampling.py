"""DAPO's dynamic sampling in GRPO-MA form: a prompt whose K·M usable rewards are all equal has zero thought and
answer advantages (no signal), so it is dropped and fresh prompts are rolled out until the step is full.

Each rank fills its own share. Every rank runs the same number of refill rounds (the largest any rank needs), so
the prompt sampler advances alike on every rank and a resumed run draws the same prompts and seeds as an
uninterrupted one. After ``max_rounds`` extra rollouts the step trains on the informative prompts it has (all
of the first draw when none was informative: their advantages are 0 and only the KL term trains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlm_grpoma.algorithm.advantages import usable_rewards
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logging import reduce_metrics
from vlm_grpoma.trainer.scoring import ScoredTree


@dataclass
class ScoredBatch:
    """A rank's prompts with their rollout tree and its scores."""

    records: list[Record]
    tree: RolloutTree
    scored: ScoredTree

    @property
    def size(self) -> int:
        return len(self.records)

    def select(self, prompts: list[int]) -> ScoredBatch:
        scored = self.scored
        per_prompt = scored.rewards.shape[1] * scored.rewards.shape[2]
        flat = [b * per_prompt + i for b in prompts for i in range(per_prompt)]
        result = RewardResult(
            total=[scored.result.total[i] for i in flat],
            components={name: [values[i] for i in flat] for name, values in scored.result.components.items()},
            failures=dict(scored.result.failures),
        )
        return ScoredBatch(
            [self.records[b] for b in prompts],
            self.tree.select(prompts),
            ScoredTree(
                [scored.completions[i] for i in flat], result, scored.rewards[prompts], scored.parsed[prompts]
            ),
        )

    @staticmethod
    def concatenate(batches: list[ScoredBatch]) -> ScoredBatch:
        """The batches' prompts in order; failure counts add up (they count every answer scored)."""
        parts = [b.scored for b in batches]
        failures: dict[str, int] = {}
        for part in parts:
            for reason, count in part.result.failures.items():
                failures[reason] = failures.get(reason, 0) + count
        names = list(parts[0].result.components)
        result = RewardResult(
            total=[v for p in parts for v in p.result.total],
            components={n: [v for p in parts for v in p.result.components[n]] for n in names},
            failures=failures,
        )
        scored = ScoredTree(
            [c for p in parts for c in p.completions],
            result,
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.parsed for p in parts]),
        )
        return ScoredBatch(
            [r for b in batches for r in b.records],
            RolloutTree.concatenate([b.tree for b in batches]),
            scored,
        )


def informative_prompts(rewards: torch.Tensor) -> list[int]:
    """Prompts of ``rewards [B, K, M]`` with at least two distinct usable rewards (a nonzero advantage): the
    advantages' own rule, :func:`~vlm_grpoma.algorithm.advantages.usable_rewards` (finite, at most 1e150)."""
    usable = usable_rewards(rewards).flatten(1)
    values = rewards.flatten(1)
    highest = values.where(usable, -torch.inf).amax(-1)
    lowest = values.where(usable, torch.inf).amin(-1)
    return (highest > lowest).nonzero().flatten().tolist()


@dataclass(frozen=True)
class Refilled:
    """The step's batch after dynamic sampling and what it took."""

    batch: ScoredBatch
    rounds: int
    rolled_prompts: int
    informative: int  # informative prompts among all rolled (some may not have been needed)

    def metrics(self) -> dict[str, float]:
        return {
            "groups/filtered_fraction": 1.0 - self.informative / max(self.rolled_prompts, 1),
            "groups/refill_rounds": float(self.rounds),
        }


def refill(
    first: ScoredBatch,
    draw: Callable[[int], ScoredBatch],
    max_rounds: int,
    timeout_s: float | None = None,
) -> Refilled:
    """Keep ``first``'s informative prompts and add those of ``draw(round)`` (a fresh share of prompts, rolled
    out and scored) until the share is full on every rank or ``max_rounds`` rounds ran."""
    target = first.size
    found = informative_prompts(first.scored.rewards)
    kept, have, informative, rolled, rounds = [first.select(found)], len(found), len(found), first.size, 0
    while rounds < max_rounds and reduce_metrics({"short": float(have < target)}, "max", timeout_s)["short"]:
        rounds += 1
        more = draw(rounds)
        found = informative_prompts(more.scored.rewards)
        rolled, informative = rolled + more.size, informative + len(found)
        useful = more.select(found[: max(target - have, 0)])
        kept.append(useful)
        have += useful.size
    if have == 0:
        return Refilled(first, rounds, rolled, 0)
    return Refilled(ScoredBatch.concatenate([b for b in kept if b.size]), rounds, rolled, informative)
