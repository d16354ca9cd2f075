"""``answer_match`` and the text answer kind on hand-made cases: exact / numeric (tolerance, commas, fractions,
negatives, decimals) / choice, "The answer is" and trailing periods, ``\\boxed{}``; malformed answers score 0."""

from __future__ import annotations

import pytest

from vlm_grpoma.answers import ParseError, TextAnswer, parse_answer
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.rewards.answer_match import as_number, matches
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.format import FormatReward
from vlm_grpoma.rewards.registry import build_rewards


def _record(answer: str, matcher=None, tolerance=None) -> Record:
    return Record("r", None, "answer", "q", None, None, ShortAnswer(answer, matcher, tolerance))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>2+3</think><answer>5</answer>", TextAnswer("5")),
        ("<answer> The answer is 1,072. </answer>", TextAnswer("The answer is 1,072.")),
        (r"<answer>so \boxed{\frac{3}{4}}</answer>", TextAnswer(r"\frac{3}{4}")),
        (r"<think>x</think> hence \boxed{ -7 }", TextAnswer("-7")),
        ("<think>x</think><answer></answer>", ParseError("empty_answer")),
        (r"<answer>\boxed{3</answer>", ParseError("unclosed_boxed", r"\boxed{3")),
        ("<answer>1</answer><answer>2</answer>", ParseError("multiple_answers", "2 <answer> tags")),
    ],
)
def test_text_answers_parse_from_tags_or_boxed_and_malformed_ones_are_errors(text, expected):
    assert parse_answer(text, "text") == expected


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        ("1,072", "1072", True),
        ("The answer is 1072.", "1072", True),
        ("3/4", "0.75", True),
        (r"\frac{3}{4}", "0.75", True),
        (r"-\frac{1}{2}", "-0.5", True),
        ("-0.50", "-1/2", True),
        ("$12$", "12", True),
        ("12.5", "12", False),
        ("1/0", "0", False),
        ("twelve", "12", False),
        ("1,07", "107", False),  # not a thousands separator
    ],
)
def test_numeric_matcher_normalises_before_comparing(answer, truth, expected):
    assert matches(answer, ShortAnswer(truth, "numeric")) is expected


def test_numeric_tolerance_is_absolute():
    assert matches("3.14", ShortAnswer("3.14159", "numeric", 0.01))
    assert not matches("3.1", ShortAnswer("3.14159", "numeric", 0.01))
    assert as_number("2,500,000") == 2_500_000.0 and as_number("abc") is None


@pytest.mark.parametrize(
    ("answer", "truth", "matcher", "expected"),
    [
        ("  Paris  ", "paris", "exact", True),
        ("The answer is New   York.", "new york", "exact", True),
        ("Paris, France", "paris", "exact", False),
        ("(b)", "B", "choice", True),
        ("The answer is C.", "(C)", "choice", True),
        ("B or C", "B", "choice", False),
    ],
)
def test_exact_and_choice_matchers(answer, truth, matcher, expected):
    assert matches(answer, ShortAnswer(truth, matcher)) is expected


def test_reward_scores_one_zero_and_malformed_zero_with_the_configured_default_matcher():
    records = [_record("1072"), _record("1072", "exact"), _record("B", "choice"), _record("5")]
    completions = [
        Completion(TextAnswer("1,072")),  # default numeric: matches
        Completion(TextAnswer("1,072")),  # the record's own exact matcher: no
        Completion(TextAnswer("(B)")),
        Completion(ParseError("no_answer_tag")),
    ]
    rewards = build_rewards({"answer_match": 1.0}, {"answer_match": {"matcher": "numeric"}})
    result = rewards.score(completions, records)
    assert result.total == [1.0, 0.0, 1.0, 0.0]
    assert result.failures == {"answer_match/no_answer_tag": 1}


def test_bad_default_matcher_names_the_config_key():
    with pytest.raises(ValueError, match=r"rewards\.options\.answer_match: matcher must be one of"):
        build_rewards({"answer_match": 1.0}, {"answer_match": {"matcher": "fuzzy"}})


def test_format_reward_accepts_text_answers_of_answer_records():
    text = "<think>2+3=5</think><answer>5</answer>"
    good = Completion(
        parse_answer(text, "text"), thought_text="<think>2+3=5</think>", answer_text="<answer>5</answer>"
    )
    bad = Completion(
        ParseError("empty_answer"), thought_text="<think>x</think>", answer_text="<answer></answer>"
    )
    result = FormatReward().score([good, bad], [_record("5"), _record("5")])
    assert result.total == [1.0, 0.0]
