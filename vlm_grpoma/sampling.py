"""Sampling parameters of one rollout call and their one constructor, :meth:`SamplingParams.from_config`.

Training, held-out evaluation, ``eval``, ``manip-eval``, the demo and the benchmarks all build them from the
rollout config through that constructor, and config validation builds them too, so the range checks live once
(here). Layer 0 beside ``config`` for that reason; it imports no other part of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SamplingParamsError(ValueError):
    """A sampling parameter out of range: ``field`` names it (``rollout.<field>`` in a config)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"SamplingParams: {field} {reason}")
        self.field = field
        self.reason = reason


class RolloutSettings(Protocol):
    """What the constructor reads of ``config.RolloutConfig`` (typed by shape: ``config`` imports this module)."""

    num_thoughts: int
    answers_per_thought: int
    temperature: float
    top_p: float
    top_k: int
    max_thought_tokens: int
    max_answer_tokens: int


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
            ("num_thoughts", self.num_thoughts >= 1, f"must be >= 1, got {self.num_thoughts}"),
            (
                "answers_per_thought",
                self.answers_per_thought >= 1,
                f"must be >= 1, got {self.answers_per_thought}",
            ),
            (
                "temperature",
                self.temperature == 0 or self.temperature >= 0.01,
                "must be 0 (greedy) or >= 0.01 (smaller ones overflow the logits; vLLM raises them to 0.01), "
                f"got {self.temperature}",
            ),
            (
                "answer_temperature",
                self.answer_temperature is None or self.answer_temperature >= 0,
                f"must be >= 0, got {self.answer_temperature}",
            ),
            ("top_p", 0 < self.top_p <= 1, f"must be in (0, 1], got {self.top_p}"),
            ("top_k", self.top_k >= 0, f"must be >= 0 (0 disables it), got {self.top_k}"),
            (
                "max_thought_tokens",
                self.max_thought_tokens >= 1,
                f"must be >= 1, got {self.max_thought_tokens}",
            ),
            ("max_answer_tokens", self.max_answer_tokens >= 1, f"must be >= 1, got {self.max_answer_tokens}"),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise SamplingParamsError(name, reason)

    @property
    def phase2_temperature(self) -> float:
        return self.temperature if self.answer_temperature is None else self.answer_temperature

    def logprob_temperature(self, temperature: float) -> float:
        """The temperature a phase sampled at ``temperature`` records its log-probs under: that temperature when
        ``tempered_logprobs`` (1 for greedy decoding, which has no distribution of its own), else 1."""
        return temperature if self.tempered_logprobs and temperature > 0 else 1.0

    @classmethod
    def from_config(
        cls,
        rollout: RolloutSettings,
        seed: int,
        *,
        greedy: bool = False,
        samples: int | None = None,
        ignore_stop: bool = False,
        tempered_logprobs: bool = False,
    ) -> SamplingParams:
        """The rollout config's K x M tree (training); ``samples``: that many independent thought + answer
        completions per record instead (M = 1, ``eval``); ``greedy``: one completion at temperature 0 with the
        filters off (they cannot change an argmax) — held-out eval, ``eval``, ``manip-eval``, the demo.
        The token budgets are always the config's; ``ignore_stop`` and ``tempered_logprobs`` as the fields."""
        if samples is not None and samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if greedy and samples not in (None, 1):
            raise ValueError(
                f"greedy decoding gives one completion per record; got samples={samples} "
                "(use greedy=False to sample several)"
            )
        if greedy:
            thoughts, answers = 1, 1
        elif samples is not None:
            thoughts, answers = samples, 1
        else:
            thoughts, answers = rollout.num_thoughts, rollout.answers_per_thought
        return cls(
            num_thoughts=thoughts,
            answers_per_thought=answers,
            temperature=0.0 if greedy else rollout.temperature,
            top_p=1.0 if greedy else rollout.top_p,
            top_k=0 if greedy else rollout.top_k,
            max_thought_tokens=rollout.max_thought_tokens,
            max_answer_tokens=rollout.max_answer_tokens,
            seed=seed,
            ignore_stop=ignore_stop,
            tempered_logprobs=tempered_logprobs,
        )


__all__ = ["RolloutSettings", "SamplingParams", "SamplingParamsError"]
