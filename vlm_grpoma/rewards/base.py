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
    """What a reward may look at for one sampled answer: the typed answer and the raw texts.

    ``thought_opened``: the prompt already opened the thought, so ``thought_text`` lacks ``<think>``.
    """

    answer: Answer | ParseError
    thought_text: str = ""
    answer_text: str = ""
    thought_opened: bool = False


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


def _ensure_registered(name: str) -> None:
    """Rewards outside the grounding set (e.g. ``manipulation``, which needs SAPIEN) register on import."""
    if name not in _REGISTRY:
        import importlib

        try:
            importlib.import_module(f"vlm_grpoma.rewards.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"vlm_grpoma.rewards.{name}":
                raise


@dataclass
class WeightedRewards:
    """The configured rewards combined: ``total = Σ weight · reward.total``.

    Components are reported per reward (``"iou"``) and per reward component (``"iou/matched"``); failure
    counts are prefixed by the reward name.
    """

    rewards: dict[str, tuple[float, Reward]]

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        total = [0.0] * len(completions)
        components: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        for name, (weight, reward) in self.rewards.items():
            result = reward.score(completions, records)
            total = [t + weight * r for t, r in zip(total, result.total)]
            components[name] = list(result.total)
            components.update({f"{name}/{key}": values for key, values in result.components.items()})
            failures.update({f"{name}/{key}": count for key, count in result.failures.items()})
        return RewardResult(total, components, failures)

    def close(self) -> None:
        """Release what rewards hold (e.g. the SAPIEN worker pool of ``manipulation``)."""
        for _, reward in self.rewards.values():
            if hasattr(reward, "close"):
                reward.close()


def build_rewards(weights: dict[str, float], options: dict[str, dict] | None = None) -> WeightedRewards:
    """Build every reward named in ``weights`` (with optional constructor options per name).

    An unknown name or a bad option raises ``ValueError`` naming the config key."""
    built = {}
    for name, weight in weights.items():
        _ensure_registered(name)
        kwargs = (options or {}).get(name, {})
        try:
            built[name] = (weight, build_reward(name, **kwargs))
        except KeyError as err:
            raise ValueError(
                f"rewards.weights.{name}: {err.args[0]} (others register when their module "
                f"vlm_grpoma.rewards.<name> is imported, e.g. manipulation)"
            ) from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"rewards.options.{name}: {err}") from None
    return WeightedRewards(built)
