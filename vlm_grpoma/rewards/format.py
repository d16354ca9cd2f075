"""Format reward: the thought+answer text has the ``<think>…</think><answer>…</answer>`` structure and the
answer parsed into the kind the record's task needs. Range: {0, 1}.

When the prompt opened the thought (Qwen3-VL Thinking releases) the completion starts inside it: the
``<think>`` the prompt wrote counts as the completion's own, and a second one breaks the structure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from vlm_grpoma.answers import ANSWER_KINDS, ParseError
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record
from vlm_grpoma.models.prompts import ThoughtFormat
from vlm_grpoma.rewards.base import Completion, RewardResult, check_batch

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
#: Exactly one of each tag, in order, with only whitespace outside them.
_STRUCTURE = re.compile(r"\s*<think>(.*)</think>\s*<answer>(.*)</answer>\s*", re.DOTALL)


def has_structure(text: str) -> bool:
    """True when ``text`` is ``<think>…</think>`` then ``<answer>…</answer>``, each tag exactly once."""
    return all(text.count(t) == 1 for t in _TAGS) and _STRUCTURE.fullmatch(text) is not None


class FormatReward:
    """1 when the structure is right AND the answer is a valid answer of the task's kind, else 0.

    Components: ``structure`` (tags alone) and ``parseable`` (typed answer of the right kind).
    """

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        check_batch("format", completions, records)
        structure, parseable, total = [], [], []
        failures: Counter[str] = Counter()
        for c, record in zip(completions, records):
            ok_structure = has_structure(
                ThoughtFormat(c.thought_opened).full_text(c.thought_text + c.answer_text)
            )
            if isinstance(c.answer, ParseError):
                ok_answer = False
                failures[c.answer.reason] += 1
            else:
                ok_answer = isinstance(c.answer, ANSWER_KINDS[ANSWER_KIND_OF_TASK[record.task]])
                if not ok_answer:
                    failures["wrong_kind"] += 1
            if not ok_structure:
                failures["bad_structure"] += 1
            structure.append(float(ok_structure))
            parseable.append(float(ok_answer))
            total.append(float(ok_structure and ok_answer))
        return RewardResult(total, {"structure": structure, "parseable": parseable}, dict(failures))
