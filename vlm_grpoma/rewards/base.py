"""What a reward is: it scores a batch of sampled answers against their records.

A reward scores (typed answer or ParseError, record) pairs and returns per-answer totals plus named
components that the trainer logs separately. Malformed answers score 0 and are counted, never raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from vlm_grpoma.answers import Answer, AnswerKind, ParseError, answers_of_kind
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
    """``score(completions, records)``: one completion per record, in the same order."""

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult: ...


def check_batch(reward: str, completions: Sequence[Completion], records: Sequence[Record]) -> None:
    """Every reward's precondition: one record per completion."""
    if len(completions) != len(records):
        raise ValueError(f"{reward} reward: {len(completions)} completions but {len(records)} records")


class ValidAnswers(NamedTuple):
    """The answers of a batch a reward can score: their positions, the answers, and why the others fail."""

    indices: list[int]
    answers: list[Answer]
    failures: dict[str, int]


def valid_answers(
    reward: str, completions: Sequence[Completion], records: Sequence[Record], kind: AnswerKind
) -> ValidAnswers:
    """:func:`check_batch`, then the answers of ``kind`` (parse failures, ``wrong_kind`` and
    ``coordinate_range`` counted) — what every answer-kind reward scores."""
    check_batch(reward, completions, records)
    return ValidAnswers(*answers_of_kind([c.answer for c in completions], kind))
