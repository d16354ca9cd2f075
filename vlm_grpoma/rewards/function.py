"""A reward written as a plain function in the user's own file, named ``path/to/file.py:function``.

In the config: ``rewards.weights={iou: 1.0, rewards/short.py:brevity: 0.2}`` (options, if the function takes
any, under ``rewards.options`` with the same name). Two signatures are recognised:

- **one answer at a time**: ``def brevity(completion: Completion, record: Record, **options) -> float``.
  ``completion.answer`` is the parsed answer in original-image pixels (``Boxes``, ``Points``, ``Trajectory``,
  ``ContactAction``) or a ``ParseError`` for a malformed one; ``completion.thought_text`` and
  ``completion.answer_text`` are the raw texts; ``record`` is the prompt's
  :class:`~vlm_grpoma.datasets.schema.Record` (ground truth, ``meta``).
- **TRL's** (a parameter named ``completions``): ``def f(completions, **kwargs) -> list[float | None]``, called
  once per batch as TRL's ``GRPOTrainer`` calls it. ``completions`` are strings: what the model wrote, thought
  then answer (``<think>…</think><answer>…</answer>``, ``<think>`` included where the prompt opened it);
  ``prompts`` the records' prompt texts; and every record field as a keyword argument holding one value per
  completion: ``id``, ``image``, ``task``, ``width``, ``height``, ``split``, ``ground_truth`` (as in the
  records file, e.g. ``{"boxes": [{"bbox_2d": [...], "label": "cat"}]}``), ``meta``, and each ``meta`` key on
  its own (the columns a converter kept). TRL's ``completion_ids`` and ``trainer_state`` are not passed.

A value is a number (``True``/``False`` count as 1/0) or None: unscorable, handled as a non-finite reward
(that answer gets no signal). An integer beyond float range is a one-line error. ``rewards.options.<name>.
timeout_s`` (default 600) bounds each call: a function that does not return in time stops the run with one
line naming it (it cannot hang a run); one that raises stops it with one line naming the reward, the record and
the line of the file that raised (``VLM_GRPOMA_DEBUG=1``: the exception itself, traceback and all). The file is
imported, and the function and its options checked, when
the rewards are built — before any model is loaded. A relative path is taken from the folder the command runs
in.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import numbers
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpoma.datasets.schema import Record, ground_truth_to_json
from vlm_grpoma.errors import UserError
from vlm_grpoma.models.prompts import ThoughtFormat
from vlm_grpoma.rewards.base import Completion, RewardResult, check_batch

#: set (to anything) to let a crashing reward function raise its own exception, traceback and all
DEBUG_ENV = "VLM_GRPOMA_DEBUG"


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


#: Seconds one call of a reward function may take unless ``rewards.options.<name>.timeout_s`` says otherwise.
DEFAULT_TIMEOUT_S = 600.0
#: The keyword arguments a TRL-style function gets besides ``completions`` (meta keys come on top).
TRL_FIELDS = ("prompts", "id", "image", "task", "width", "height", "split", "ground_truth", "meta")


def is_trl_style(function: Callable[..., Any]) -> bool:
    """TRL's reward signature: a parameter named ``completions`` (the batch of texts)."""
    try:
        return "completions" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the one-answer style
        return False


class _DeadlineCaller:
    """Runs calls on one daemon thread and waits at most ``timeout_s`` for each; a call past its deadline
    is abandoned (the thread cannot be stopped, but it no longer holds the run)."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def _work(self) -> None:
        while True:
            function, args, kwargs, done, result = self._jobs.get()
            try:
                result.append((True, function(*args, **kwargs)))
            except BaseException as err:  # handed back to the caller's thread, raised there
                result.append((False, err))
            done.set()

    def __call__(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name=f"reward {self.name}", daemon=True)
            self._thread.start()
        done, result = threading.Event(), []
        self._jobs.put((function, args, kwargs, done, result))
        if not done.wait(self.timeout_s):
            self._thread, self._jobs = None, queue.Queue()  # the stuck thread keeps the old queue
            raise RewardFileError(
                f"reward {self.name} did not return within {self.timeout_s:g} s {what} "
                f"(rewards.options.{self.name}.timeout_s)"
            )
        ok, value = result[0]
        if not ok:
            raise value
        return value


def _as_reward(name: str, value: Any, where: str) -> float:
    """A returned value as a float: numbers and bools; None (unscorable) as NaN; anything else one line."""
    if value is None:
        return math.nan
    if not isinstance(value, numbers.Real):
        raise RewardFileError(
            f"reward {name} returned {value!r:.80} (a {type(value).__name__}) {where}; it must return a number "
            "or None"
        )
    try:
        return float(value)
    except OverflowError:
        raise RewardFileError(
            f"reward {name} returned an integer of {len(str(abs(int(value))))} digits {where}, beyond float "
            "range; return a float"
        ) from None


def _trl_kwargs(records: Sequence[Record]) -> dict[str, list[Any]]:
    """The records as TRL's dataset columns: one list per field, one value per completion."""
    columns: dict[str, list[Any]] = {
        "prompts": [r.prompt for r in records],
        "id": [r.id for r in records],
        "image": [r.image for r in records],
        "task": [r.task for r in records],
        "width": [r.width for r in records],
        "height": [r.height for r in records],
        "split": [r.split for r in records],
        "ground_truth": [ground_truth_to_json(r.ground_truth) for r in records],
        "meta": [r.meta for r in records],
    }
    for key in dict.fromkeys(k for r in records for k in r.meta):
        if key not in columns and key != "completions":
            columns[key] = [r.meta.get(key) for r in records]
    return columns


def completion_text(completion: Completion) -> str:
    """What a TRL-style reward sees of a completion: the model's text, thought then answer, with ``<think>``."""
    return ThoughtFormat(completion.thought_opened).full_text(
        completion.thought_text + completion.answer_text
    )


@dataclass
class FunctionReward:
    """Scores completions with the user's function (either signature, see the module docstring); one
    component: the value."""

    name: str
    function: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, numbers.Real) and 0 < self.timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        self.trl_style = is_trl_style(self.function)
        try:  # the options must fit the signature now, not at the first training step
            if self.trl_style:
                inspect.signature(self.function).bind_partial(completions=[], **self.options)
            else:
                inspect.signature(self.function).bind(None, None, **self.options)
        except TypeError as err:
            shape = "completions, **kwargs" if self.trl_style else "completion, record"
            raise TypeError(
                f"{self.name} must accept ({shape}{', ' if self.options else ''}"
                f"{', '.join(f'{k}=' for k in self.options)}): {err}"
            ) from None
        self._call = _DeadlineCaller(self.name, float(self.timeout_s))

    def _crashed(self, err: BaseException, where: str) -> BaseException:
        """A bug in the user's function, as what to raise: one line naming the reward, the record and the line of
        the user's file that raised; with ``VLM_GRPOMA_DEBUG=1`` the original exception and its traceback."""
        if isinstance(err, RewardFileError):
            return err
        if os.environ.get(DEBUG_ENV):
            err.add_note(f"in reward {self.name} {where}")
            return err
        source = getattr(getattr(self.function, "__code__", None), "co_filename", None)
        frames = traceback.extract_tb(err.__traceback__)
        own = [f for f in frames if f.filename == source] or frames[-1:]  # its file's line, else the last
        at = f" at {own[-1].filename}:{own[-1].lineno}: {own[-1].line}" if own else ""
        return RewardFileError(
            f"reward {self.name} raised {type(err).__name__}: {err} {where}{at} "
            f"({DEBUG_ENV}=1 shows the traceback)"
        )

    def _score_trl(self, completions: Sequence[Completion], records: Sequence[Record]) -> list[float]:
        where = f"for the batch of records {records[0].id}…{records[-1].id}" if records else "for no records"
        columns = {**_trl_kwargs(records), **self.options}
        try:
            values = self._call(where, self.function, [completion_text(c) for c in completions], **columns)
        except Exception as err:
            raise self._crashed(err, f"scoring the batch of records {records[0].id}…") from err
        if (
            not isinstance(values, Sequence)
            or isinstance(values, (str, bytes))
            or len(values) != len(records)
        ):
            raise RewardFileError(
                f"reward {self.name} returned {values!r:.80} {where}; a TRL-style reward returns a list of "
                f"{len(records)} numbers or None, one per completion"
            )
        return [_as_reward(self.name, v, f"for record {r.id}") for v, r in zip(values, records)]

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        check_batch(self.name, completions, records)
        if self.trl_style:
            return RewardResult(self._score_trl(completions, records))
        totals = []
        for completion, record in zip(completions, records):
            where = f"for record {record.id}"
            try:
                value = self._call(where, self.function, completion, record, **self.options)
            except Exception as err:
                raise self._crashed(err, f"scoring record {record.id}") from err
            totals.append(_as_reward(self.name, value, where))
        return RewardResult(totals)


def function_reward_factory(spec: str) -> Callable[..., FunctionReward]:
    """The factory ``build_rewards`` calls with the reward's options; the file is imported right away."""
    function = load_function(spec)

    def build(timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any) -> FunctionReward:
        return FunctionReward(spec, function, options, timeout_s)

    return build


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FunctionReward",
    "RewardFileError",
    "completion_text",
    "function_reward_factory",
    "is_function_spec",
    "is_trl_style",
    "load_function",
]
