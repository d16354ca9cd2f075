"""Reward protocol and registry (DESIGN.md §3 Rewards).

A reward scores a batch of (typed answer or ParseError, record) pairs and returns per-answer totals plus
named components that the trainer logs separately. Malformed answers score 0, never raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vlm_grpoma.answers import Answer, ParseError
from vlm_grpoma.datasets.schema import Record


@dataclass
class RewardResult:
    total: list[float]
    components: dict[str, list[float]] = field(default_factory=dict)
    #: ParseError reasons (and other zero-score causes) counted over the batch, for logging.
    failures: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """What a reward may look at for one sampled answer: the typed answer and the raw texts."""

    answer: Answer | ParseError
    thought_text: str = ""
    answer_text: str = ""


class Reward(Protocol):
    name: str

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult: ...


_REGISTRY: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Class/factory decorator: make a reward constructible by name from the config."""

    def decorate(factory: Callable[..., Reward]) -> Callable[..., Reward]:
        if name in _REGISTRY:
            raise ValueError(f"reward {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return decorate


def build_reward(name: str, **options) -> Reward:
    if name not in _REGISTRY:
        raise KeyError(f"unknown reward {name!r}; registered: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name](**options)


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)
