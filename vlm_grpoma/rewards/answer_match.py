"""``answer_match``: 1 when a short text answer equals the record's ``ShortAnswer`` after normalisation, else 0.

Matchers: ``exact`` (case- and whitespace-insensitive text), ``numeric`` (numbers within ``tolerance``; thousands
separators, fractions ``3/4`` and ``\\frac{3}{4}``, negatives, decimals), ``choice`` (a letter such as ``(B)``).
Every answer is first stripped of a leading "The answer is", ``$…$`` and a trailing period.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

from vlm_grpoma.answers import TextAnswer
from vlm_grpoma.datasets.schema import MATCHERS, Record, ShortAnswer
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers

_LEAD = re.compile(r"^\s*(?:the\s+(?:final\s+)?answer\s+is\s*:?)\s*", re.IGNORECASE)
_FRAC = re.compile(r"^\\[dt]?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}$")
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_CHOICE = re.compile(r"^\(?([A-Za-z])\)?$")


def strip_answer(text: str) -> str:
    """Whitespace collapsed, a leading "The answer is", surrounding ``$`` and a trailing period removed."""
    text = " ".join(_LEAD.sub("", text).split())
    text = text.strip("$ ").removesuffix(".").strip()
    return text


def as_number(text: str) -> float | None:
    """The value of a plain number, ``a/b`` or ``\\frac{a}{b}`` (commas between thousands ignored); else None."""
    text = _THOUSANDS.sub("", strip_answer(text)).replace(" ", "")
    negative = text.startswith("-") and _FRAC.match(text[1:]) is not None
    frac = _FRAC.match(text[1:] if negative else text)
    parts = frac.groups() if frac else text.split("/") if text.count("/") == 1 else (text,)
    if not all(_NUMBER.match(p) for p in parts):
        return None
    try:
        value = Fraction(parts[0]) / Fraction(parts[1]) if len(parts) == 2 else Fraction(parts[0])
    except ZeroDivisionError:
        return None
    return -float(value) if negative else float(value)


def matches(answer: str, truth: ShortAnswer, default_matcher: str = "exact") -> bool:
    """Whether ``answer`` is ``truth`` under its matcher (the default when the record names none)."""
    matcher = truth.matcher or default_matcher
    if matcher == "numeric":
        got, want = as_number(answer), as_number(truth.answer)
        if got is None or want is None:
            return False
        return math.isclose(got, want, rel_tol=0.0, abs_tol=truth.tolerance or 1e-9)
    if matcher == "choice":
        got, want = _CHOICE.match(strip_answer(answer)), _CHOICE.match(strip_answer(truth.answer))
        return bool(got and want) and got.group(1).lower() == want.group(1).lower()
    return strip_answer(answer).casefold() == strip_answer(truth.answer).casefold()


class AnswerMatchReward:
    """Reward ``answer_match``: scores text answers of ``answer`` records; malformed answers score 0."""

    def __init__(self, matcher: str = "exact") -> None:
        if matcher not in MATCHERS:
            raise ValueError(f"matcher must be one of {list(MATCHERS)}, got {matcher!r}")
        self.matcher = matcher

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        indices, answers, failures = valid_answers("answer_match", completions, records, "text")
        total = [0.0] * len(completions)
        for i, answer in zip(indices, answers):
            truth = records[i].ground_truth
            if not isinstance(truth, ShortAnswer):
                raise ValueError(
                    f"answer_match reward: record {records[i].id} has no short-answer ground truth"
                )
            assert isinstance(answer, TextAnswer)
            total[i] = float(matches(answer.text, truth, self.matcher))
        return RewardResult(total, {"correct": list(total)}, failures)
