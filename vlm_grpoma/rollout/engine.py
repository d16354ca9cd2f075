"""The rollout backend protocol: sampling parameters in, a :class:`RolloutTree` out; trained weights in.

Phase 1 samples K thoughts per prompt, each ending at ``</think>`` or closed by force at the thought budget;
phase 2 samples M answers continuing each thought, ending at ``</answer>``, end of turn, or the answer budget.
Each backend owns how it follows the trained policy (``update_weights``, called after every optimizer step).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

from vlm_grpoma.config import RolloutConfig
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.tree import RolloutTree


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``top_k == 0`` and ``top_p == 1`` disable those filters.

    ``answer_temperature`` (None: same as ``temperature``) lets phase 2 differ, e.g. greedy answers for
    sampled thoughts. ``ignore_stop`` runs every thought and answer to its budget (benchmarks compare equal
    work with it).
    """

    num_thoughts: int = 4
    answers_per_thought: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_thought_tokens: int = 256
    max_answer_tokens: int = 64
    seed: int = 0
    answer_temperature: float | None = None
    ignore_stop: bool = False
    #: record log-probs under ``logits / T`` of each phase (what the trainer scores with
    #: ``algorithm.logprob_temperature: sampling``); False: under the raw logits (T = 1)
    tempered_logprobs: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.num_thoughts >= 1, f"num_thoughts must be >= 1, got {self.num_thoughts}"),
            (
                self.answers_per_thought >= 1,
                f"answers_per_thought must be >= 1, got {self.answers_per_thought}",
            ),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (
                self.answer_temperature is None or self.answer_temperature >= 0,
                f"answer_temperature must be >= 0, got {self.answer_temperature}",
            ),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (self.max_thought_tokens >= 1, f"max_thought_tokens must be >= 1, got {self.max_thought_tokens}"),
            (self.max_answer_tokens >= 1, f"max_answer_tokens must be >= 1, got {self.max_answer_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {message}")

    @property
    def phase2_temperature(self) -> float:
        return self.temperature if self.answer_temperature is None else self.answer_temperature

    def logprob_temperature(self, temperature: float) -> float:
        """The temperature a phase sampled at ``temperature`` records its log-probs under: that temperature when
        ``tempered_logprobs`` (1 for greedy decoding, which has no distribution of its own), else 1."""
        return temperature if self.tempered_logprobs and temperature > 0 else 1.0

    @classmethod
    def from_config(
        cls, config: RolloutConfig, seed: int, *, tempered_logprobs: bool = False
    ) -> SamplingParams:
        return cls(
            num_thoughts=config.num_thoughts,
            answers_per_thought=config.answers_per_thought,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_thought_tokens=config.max_thought_tokens,
            max_answer_tokens=config.max_answer_tokens,
            seed=seed,
            tempered_logprobs=tempered_logprobs,
        )


class RolloutEngine(Protocol):
    """A backend that samples the K x M tree for a batch of prompts with the policy's current weights."""

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree: ...

    def update_weights(self, model: Any) -> int:
        """Bring the backend in step with ``model`` (a module, or a training engine: see :func:`full_module`).

        Called on every rank after each optimizer step. Returns how many weight tensors were copied (0 for a
        backend that samples from the live module).
        """
        ...


@contextmanager
def full_module(model: Any) -> Iterator[torch.nn.Module]:
    """The complete policy module behind ``model``: a plain module itself, or a training engine's module inside
    its ``generation()`` context (eval mode, no grad, ZeRO-3 parameters gathered; a collective on all ranks)."""
    import torch

    if isinstance(model, torch.nn.Module):
        yield model
    else:
        with model.generation() as module:
            yield module
