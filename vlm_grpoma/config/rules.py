"""Single-field rules of the config, declared in each field's metadata (``checked``) and applied by one checker."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

_RULE = "rule"
_T = TypeVar("_T")


class Rule(Protocol):
    """What one field's values must satisfy, on their own."""

    def allows(self, value: Any) -> bool: ...

    def complaint(self, value: Any) -> str: ...

    def describe(self) -> str: ...


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``ge``/``gt`` below, ``le``/``lt`` above (its meaning), ``cap`` a sanity ceiling
    beyond which a value can only be a slip (learning rate 1e300); errors name the bound that was crossed."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    cap: float | None = None
    what: str = ""  # before the condition: "a finite number of seconds >= 0"
    unit: str = ""  # after it: "> 0 seconds"
    note: str = ""  # in brackets after it: "(0: no limit)"

    def allows(self, value: Any) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
            and (self.cap is None or value <= self.cap)
        )

    def _condition(self) -> str:
        low = (
            f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else ""
        )
        high = (
            f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else ""
        )
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        return ("<= " if high[-1] == "]" else "< ") + high[:-1] if high else "any number"

    def _dress(self, condition: str) -> str:
        text = " ".join(part for part in (self.what, condition, self.unit) if part)
        return f"{text} ({self.note})" if self.note else text

    def complaint(self, value: Any) -> str:
        if self.cap is not None and value > self.cap:
            return f"must be at most {_num(self.cap)}{' ' + self.unit if self.unit else ''}, got {value}"
        return f"must be {self._dress(self._condition())}, got {value}"

    def describe(self) -> str:
        cap = f", at most {_num(self.cap)}" if self.cap is not None else ""
        return self._dress(self._condition()) + cap


@dataclass(frozen=True)
class NonEmpty:
    """A string with more than whitespace, or a mapping with an entry; ``message`` says what is missing."""

    message: str

    def allows(self, value: Any) -> bool:
        return bool(value.strip() if isinstance(value, str) else value)

    def complaint(self, value: Any) -> str:
        return self.message

    def describe(self) -> str:
        return "non-empty"


#: The tasks a ``data.prompt_template`` entry may name.
_PROMPT_TASKS = ("detection", "affordance", "trajectory", "manipulation", "answer")


@dataclass(frozen=True)
class PromptTemplates:
    """``task -> str.format template`` entries: a known task, non-empty text, plain ``{name}`` fields only."""

    def _problem(self, value: Any) -> str | None:
        import string

        for task, template in value.items():
            if task not in _PROMPT_TASKS:
                return f"{task}: is not a task; templates are per task: {', '.join(_PROMPT_TASKS)}"
            if not isinstance(template, str) or not template.strip():
                return f"{task}: is empty; leave the task out to keep the default"
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
            except ValueError as err:
                return f"{task}: is not a str.format template: {err} (write {{{{ and }}}} for literal braces)"
            for name in names:
                if not name.isidentifier():
                    return f"{task}: field {{{name}}}: name a record field, e.g. {{prompt}} (no indexing or attributes)"
        return None

    def allows(self, value: Any) -> bool:
        return self._problem(value) is None

    def complaint(self, value: Any) -> str:
        return self._problem(value) or ""

    def describe(self) -> str:
        return "task -> template over the record's fields"


def checked(default: _T, rule: Rule) -> _T:
    """A dataclass field with its default and the single-field rule ``check_fields`` applies to it."""
    return typing.cast(_T, field(default=default, metadata={_RULE: rule}))
