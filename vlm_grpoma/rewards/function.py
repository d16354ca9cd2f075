"""A reward written as a plain function in the user's own file, named ``path/to/file.py:function``.

In the config: ``rewards.weights={iou: 1.0, rewards/short.py:brevity: 0.2}`` (options, if the function takes
any, under ``rewards.options`` with the same name). The function scores one answer::

    def brevity(completion: Completion, record: Record, **options) -> float

``completion.answer`` is the parsed answer in original-image pixels (``Boxes``, ``Points``, ``Trajectory``,
``ContactAction``) or a ``ParseError`` for a malformed one; ``completion.thought_text`` and
``completion.answer_text`` are the raw texts; ``record`` is the prompt's :class:`~vlm_grpoma.datasets.schema.
Record` (ground truth, ``meta``). It returns a number (NaN or inf make the trainer skip the step, as for any
reward; ``True``/``False`` count as 1/0). The file is imported, and the function and its options checked, when the rewards are built —
before any model is loaded. A relative path is taken from the folder the command runs in.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import UserError
from vlm_grpoma.rewards.base import Completion, RewardResult, check_batch


class RewardFileError(UserError, ValueError):
    """A ``file.py:function`` reward that cannot be used: missing file, import error, no such function."""


def is_function_spec(name: str) -> bool:
    """True for a reward named ``path/to/file.py:function`` rather than by a registered name."""
    path, sep, function = name.rpartition(":")
    return bool(sep) and path.endswith(".py") and function.isidentifier()


def load_function(spec: str) -> Callable[..., Any]:
    """Import the file of ``spec`` (under a module name private to its path) and return its function."""
    path_text, _, function_name = spec.rpartition(":")
    path = Path(path_text).resolve()
    if not path.is_file():
        raise RewardFileError(f"reward file {path_text} not found (relative paths start at {Path.cwd()})")
    module_name = f"vlm_grpoma_user_reward_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if module_name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # the user's module: any import-time failure is reported, with its kind
            raise RewardFileError(f"importing {path_text} failed: {type(err).__name__}: {err}") from err
        sys.modules[module_name] = module
    function = getattr(sys.modules[module_name], function_name, None)
    if not callable(function):
        raise RewardFileError(f"{path_text} has no function {function_name!r}")
    return function


@dataclass
class FunctionReward:
    """Scores every completion with ``function(completion, record, **options)``; one component: the value."""

    name: str
    function: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:  # the options must fit the signature now, not at the first training step
            inspect.signature(self.function).bind(None, None, **self.options)
        except TypeError as err:
            raise TypeError(
                f"{self.name} must accept (completion, record{', ' if self.options else ''}"
                f"{', '.join(f'{k}=' for k in self.options)}): {err}"
            ) from None

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        check_batch(self.name, completions, records)
        totals = []
        for completion, record in zip(completions, records):
            try:
                value = self.function(completion, record, **self.options)
            except Exception as err:  # a bug in the user's function: keep its traceback, say where it struck
                if hasattr(err, "add_note"):
                    err.add_note(f"in reward {self.name} scoring record {record.id}")
                raise
            if not isinstance(value, numbers.Real):
                raise RewardFileError(
                    f"reward {self.name} returned {value!r} (a {type(value).__name__}) for record "
                    f"{record.id}; it must return a number"
                )
            totals.append(float(value))
        return RewardResult(totals)


def function_reward_factory(spec: str) -> Callable[..., FunctionReward]:
    """The factory ``build_rewards`` calls with the reward's options; the file is imported right away."""
    function = load_function(spec)

    def build(**options: Any) -> FunctionReward:
        return FunctionReward(spec, function, options)

    return build


__all__ = [
    "FunctionReward",
    "RewardFileError",
    "function_reward_factory",
    "is_function_spec",
    "load_function",
]
