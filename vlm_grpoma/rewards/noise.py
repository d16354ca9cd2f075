"""Training rewards made noisy on purpose (``rewards.noise``): an experimental control for when M answers per
thought pay, not a training feature.

GRPO-MA's thought-advantage variance ``σ²/(M·τ² + σ̄²)`` shrinks with M only where the reward given a fixed
thought is noisy (σ² against the between-thought spread τ²). Flipping one reward's score ``s ∈ [0, 1]`` to
``1 − s`` with probability p per sampled answer adds exactly such noise: for a 0/1 score the answer's reward
given its thought becomes Bernoulli(q(1 − p) + (1 − q)p). Draws come from one generator per run and rank,
one per scored answer in scoring order (deterministic for a seed). The trainer wraps only its rollout scoring:
held-out evaluation keeps the clean rewards.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion, RewardResult
from vlm_grpoma.rewards.registry import WeightedRewards


@dataclass
class NoisyRewards:
    """``rewards`` with reward ``name``'s score flipped with probability ``flip`` per answer; the clean score is
    kept as the component ``<name>/clean`` and the flips as ``noise/flipped``."""

    rewards: WeightedRewards
    name: str
    flip: float
    seed: str  # e.g. '<run seed>/<rank>': random.Random hashes a string seed the same in every process
    _draws: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.name not in self.rewards.rewards:
            raise ValueError(f"rewards.noise.reward: {self.name!r} is not among the rewards")
        self._draws = random.Random(self.seed)

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        result = self.rewards.score(completions, records)
        weight = self.rewards.rewards[self.name][0]
        clean = result.components[self.name]
        noisy, flipped = list(clean), [0.0] * len(clean)
        for i, score in enumerate(clean):
            if self._draws.random() < self.flip:
                noisy[i], flipped[i] = 1.0 - score, 1.0
                result.total[i] += weight * (noisy[i] - score)
        result.components |= {self.name: noisy, f"{self.name}/clean": clean, "noise/flipped": flipped}
        return result
