"""Deterministic prompt order: seeded per-epoch permutations, sharded across ranks, resumable by position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PromptSampler:
    """Yields each step's global prompt indices; rank r takes its contiguous slice of them.

    The order depends only on (seed, epoch), so a resumed run given the saved ``state_dict`` continues with
    exactly the prompts the uninterrupted run would have seen.
    """

    num_records: int
    prompts_per_step: int
    seed: int = 0
    shuffle: bool = True
    epoch: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        if self.num_records < 1:
            raise ValueError("the training set is empty")

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_records))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_records, generator=generator).tolist()

    def next_step(self) -> list[int]:
        """The ``prompts_per_step`` record indices of the next step (crossing epochs as needed)."""
        indices: list[int] = []
        while len(indices) < self.prompts_per_step:
            order = self._order(self.epoch)
            take = order[self.position : self.position + self.prompts_per_step - len(indices)]
            indices.extend(take)
            self.position += len(take)
            if self.position >= self.num_records:
                self.epoch, self.position = self.epoch + 1, 0
        return indices

    @staticmethod
    def shard(indices: list[int], rank: int, world_size: int) -> list[int]:
        per_rank = len(indices) // world_size
        return indices[rank * per_rank : (rank + 1) * per_rank]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_records": self.num_records,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_records"] != self.num_records or state["seed"] != self.seed:
            raise ValueError(
                f"cannot resume the data order: the checkpoint saw {state['num_records']} records with "
                f"seed {state['seed']}, this run has {self.num_records} with seed {self.seed}"
            )
        self.epoch, self.position = state["epoch"], state["position"]
