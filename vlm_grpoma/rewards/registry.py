"""Rewards by name: the built-in table, extra rewards registered by code, plain functions in the user's own
files (``path/to/file.py:function``, see :mod:`~vlm_grpoma.rewards.function`), and the weighted combination a
config asks for (``rewards.weights`` and ``rewards.options``).

Built-in rewards are imported only when a config names them (``manipulation`` needs SAPIEN).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion, Reward, RewardResult
from vlm_grpoma.rewards.function import RewardFileError, function_reward_factory, is_function_spec

#: Built-in rewards: config name -> ``module:factory``.
BUILTIN_REWARDS: dict[str, str] = {
    "format": "vlm_grpoma.rewards.format:FormatReward",
    "iou": "vlm_grpoma.rewards.detection:IoUReward",
    "affordance": "vlm_grpoma.rewards.affordance:AffordanceReward",
    "trajectory": "vlm_grpoma.rewards.trajectory:TrajectoryReward",
    "manipulation": "vlm_grpoma.rewards.manipulation:ManipulationReward",
    "answer_match": "vlm_grpoma.rewards.answer_match:AnswerMatchReward",
}
_REGISTERED: dict[str, Callable[..., Reward]] = {}
#: Built-in rewards of image coordinates: every short answer (task ``answer``) would score 0 under them.
COORDINATE_REWARDS = ("iou", "affordance", "trajectory", "manipulation")


def register_reward(name: str, factory: Callable[..., Reward]) -> None:
    """Make ``factory(**options)`` constructible as reward ``name`` (for rewards defined outside the suite)."""
    if name in BUILTIN_REWARDS or name in _REGISTERED:
        raise ValueError(f"reward {name!r} is already registered")
    _REGISTERED[name] = factory


def registered_rewards() -> list[str]:
    return sorted([*BUILTIN_REWARDS, *_REGISTERED])


def reward_factory(name: str) -> Callable[..., Reward]:
    """The factory of reward ``name`` (a registered name or ``file.py:function``); KeyError listing the known
    names, RewardFileError for a function file that cannot be used."""
    if is_function_spec(name):
        return function_reward_factory(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BUILTIN_REWARDS:
        raise KeyError(
            f"unknown reward {name!r}; registered: {', '.join(registered_rewards())}, or a function "
            "in your own file as path/to/file.py:function"
        )
    module, attribute = BUILTIN_REWARDS[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def build_reward(name: str, **options) -> Reward:
    return reward_factory(name)(**options)


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

    An unknown name, an unusable reward file or a bad option raises ``ValueError`` naming the config key."""
    built = {}
    for name, weight in weights.items():
        try:
            factory = reward_factory(name)
        except (KeyError, RewardFileError) as err:
            raise ValueError(f"rewards.weights.{name}: {err.args[0]}") from None
        try:
            built[name] = (weight, factory(**(options or {}).get(name, {})))
        except (TypeError, ValueError) as err:
            raise ValueError(f"rewards.options.{name}: {err}") from None
    return WeightedRewards(built)


def check_rewards_fit_task(weights: dict[str, float], task: str, records_task: str | None = None) -> None:
    """``ValueError`` naming the key when a built-in reward could only score 0 on ``task``'s answers: a
    coordinate reward on short answers, or ``answer_match`` on coordinates. ``records_task``, the task the
    training records name (their first one), turns the second case into the fix when they are ``answer``
    records left at another ``data.task``."""
    coordinates = [name for name in weights if name in COORDINATE_REWARDS]
    if task == "answer" and coordinates:
        raise ValueError(
            f"rewards.weights.{coordinates[0]}: scores image coordinates, but data.task=answer records have "
            "short text answers (each would score 0); use answer_match, e.g. {answer_match: 1.0, format: 0.5}"
        )
    if task != "answer" and "answer_match" in weights and records_task == "answer":
        raise ValueError(
            f"data.task: is {task}, but the training records are `answer` records (short text answers, what "
            "rewards.weights.answer_match scores); set data.task=answer"
        )
    if task != "answer" and "answer_match" in weights:
        raise ValueError(
            f"rewards.weights.answer_match: scores short text answers, but data.task={task} answers are "
            "coordinates (each would score 0); leave it out"
        )
