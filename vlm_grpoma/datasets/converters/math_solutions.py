"""The final answer and the worked solution of a math dataset's solution text (GSM8K ``####``, MATH ``\\boxed{}``).

Pure text functions, no I/O: the parquet converter (:mod:`.math_parquet`) maps columns, these read one cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: GSM8K's calculator annotations inside the worked solution: ``48/2 = <<48/2=24>>24``.
_CALCULATOR = re.compile(r"<<[^<>]*>>")
#: A plain decimal number (after thousands separators are removed): what a numeric matcher can compare.
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")
#: ``\boxed`` and ``\fbox`` (MATH uses both), followed by ``{`` or, in the ``\boxed 5`` form, a space.
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


@dataclass(frozen=True)
class Solution:
    """A solution's final answer, the worked reasoning (a reference thought for SFT) and how to match it."""

    answer: str
    thought: str
    matcher: str  # "numeric" or "exact"


def plain_number(text: str) -> str | None:
    """``text`` as a plain number without thousands separators, ``$`` or spaces (``"1,234"`` -> ``"1234"``),
    or None when it is not one."""
    cleaned = re.sub(r"[\s,$]", "", text)
    return cleaned if _NUMBER.fullmatch(cleaned) else None


def gsm8k_solution(text: str) -> Solution | None:
    """GSM8K: the reasoning before ``####`` (calculator annotations removed) and the number after it;
    None when there is no ``####`` or nothing after it. A final answer that is not a number is a ValueError."""
    reasoning, sep, final = text.rpartition("####")
    if not sep or not final.strip():
        return None
    number = plain_number(final)
    if number is None:
        raise ValueError(f"the final answer after #### is not a number: {final.strip()[:40]!r}")
    return Solution(number, _CALCULATOR.sub("", reasoning).strip(), "numeric")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces kept, e.g.
    ``\\frac{1}{2}``), or the token of ``\\boxed 5``; None when there is none or its braces never close."""
    matches = list(_BOX_COMMAND.finditer(text))
    for match in reversed(matches):
        rest = text[match.end() :]
        if rest.startswith(" ") and rest.strip():
            return rest.split()[0].rstrip("$.,") or None
        if not rest.startswith("{"):
            continue
        depth = 0
        for i, char in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth == 0:
                return rest[1:i].strip() or None
    return None


def boxed_solution(text: str) -> Solution | None:
    """MATH: the last boxed answer (numeric matcher when it is a plain number, else exact after the
    matcher's normalisation) and the whole solution as the thought; None when nothing is boxed."""
    answer = last_boxed(text)
    if answer is None:
        return None
    number = plain_number(answer)
    return Solution(
        number if number is not None else answer, text.strip(), "numeric" if number is not None else "exact"
    )


__all__ = ["Solution", "boxed_solution", "gsm8k_solution", "last_boxed", "plain_number"]
