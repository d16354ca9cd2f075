"""Format reward: tag structure plus a typed answer of the task's kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm_grpoma.answers import Box, Boxes, ParseError, Points, Trajectory, parse_answer
from vlm_grpoma.datasets.schema import Record, ShortAnswer
from vlm_grpoma.rewards import build_reward
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.format import FormatReward, has_structure


@pytest.mark.parametrize(
    "text, ok",
    [
        ("<think>a</think><answer>b</answer>", True),
        ("  \n<think>\na\n</think>\n\n<answer> b </answer>\n", True),
        ("<think></think><answer></answer>", True),
        ("<think>a</think>x<answer>b</answer>", False),  # text between the blocks
        ("x<think>a</think><answer>b</answer>", False),
        ("<think>a</think><answer>b</answer>x", False),
        ("<answer>b</answer><think>a</think>", False),
        ("<think>a</think>", False),
        ("<answer>b</answer>", False),
        ("<think>a<think>b</think><answer>c</answer>", False),
        ("<think>a</think><answer>b</answer><answer>c</answer>", False),
        ("<think>a</think><answer>b", False),
        ("<think>a <answer>b</answer></think>", False),
        ("", False),
    ],
)
def test_structure(text, ok):
    assert has_structure(text) is ok


def test_reward_needs_structure_and_the_task_kind(make_record):
    det = make_record(Boxes((Box(0, 0, 1, 1),)), task="detection")
    aff = make_record(Points(((1, 1),)), task="affordance")
    box = Boxes((Box(0, 0, 1, 1),))
    cases = [
        (Completion(box, "<think>t</think>", "<answer>[0, 0, 1, 1]</answer>"), det, 1.0, 1.0),
        (Completion(box, "<think>t</think>", "[0, 0, 1, 1]"), det, 0.0, 1.0),  # parseable, tags missing
        (Completion(ParseError("invalid_json"), "<think>t</think>", "<answer>[0, 0</answer>"), det, 1.0, 0.0),
        (Completion(box, "<think>t</think>", "<answer>[0, 0, 1, 1]</answer>"), aff, 1.0, 0.0),  # wrong kind
        (Completion(Points(((1, 1),)), "<think>t</think>", "<answer>[1, 1]</answer>"), aff, 1.0, 1.0),
    ]
    result = build_reward("format").score([c for c, *_ in cases], [r for _, r, *_ in cases])
    assert result.components["structure"] == [s for *_, s, _ in cases]
    assert result.components["parseable"] == [p for *_, p in cases]
    assert result.total == [s * p for *_, s, p in cases]
    assert result.failures == {"bad_structure": 1, "invalid_json": 1, "wrong_kind": 1}


def test_reward_rejects_mismatched_lengths(make_record):
    with pytest.raises(ValueError, match="2 completions but 1 records"):
        FormatReward().score([Completion(ParseError("x"))] * 2, [make_record(Boxes(()))])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=60), st.text(max_size=60))
def test_reward_is_binary_and_consistent_with_the_parser(thought, answer):
    rec = Record("r", "i.png", "trajectory", "p", 100, 100, Trajectory(((0, 0), (1, 1))))
    text = f"<think>{thought}</think><answer>{answer}</answer>"
    parsed = parse_answer(text, "trajectory")
    result = FormatReward().score(
        [Completion(parsed, f"<think>{thought}</think>", f"<answer>{answer}</answer>")], [rec]
    )
    assert result.total[0] in (0.0, 1.0)
    if result.total[0] == 1.0:
        assert isinstance(parsed, Trajectory) and has_structure(text)


@pytest.mark.parametrize(
    "thought, answer, opened, total, failure",
    [
        ("<think>7+5=12</think>", "<answer>12</answer>", False, 1.0, None),
        ("<think>7+5=12</think>", "<answer>so \\boxed{12}</answer>", False, 1.0, None),
        ("7+5=12</think>", "\n\n<answer>12</answer>", True, 1.0, None),  # the prompt opened the thought
        ("<think>7+5=12</think>", "\\boxed{12}", False, 0.0, "bad_structure"),  # parseable, tags missing
        ("<think>7+5=12</think>", "<answer>  </answer>", False, 0.0, "empty_answer"),
        ("<think>7+5=12</think>", "<answer>\\boxed{12</answer>", False, 0.0, "unclosed_boxed"),
        ("<think>a</think><think>b</think>", "<answer>12</answer>", False, 0.0, "bad_structure"),
    ],
)
def test_text_answers_of_answer_records(thought, answer, opened, total, failure):
    """The format reward on short answers: the same tag structure, and a text answer (``\\boxed{}`` inside
    ``<answer>`` or alone) in place of coordinates, parsed as the trainer parses a completion."""
    rec = Record("r", None, "answer", "Compute: 7 +5", None, None, ShortAnswer("12"))
    completion = Completion(parse_answer(thought + answer, "text"), thought, answer, opened)
    result = FormatReward().score([completion], [rec])
    assert result.total == [total]
    assert result.failures == ({} if failure is None else {failure: 1})


def test_a_coordinate_answer_is_the_wrong_kind_for_an_answer_record():
    rec = Record("r", None, "answer", "p", None, None, ShortAnswer("12"))
    box = Completion(Boxes((Box(0, 0, 1, 1),)), "<think>t</think>", "<answer>[0, 0, 1, 1]</answer>")
    result = FormatReward().score([box], [rec])
    assert result.total == [0.0] and result.failures == {"wrong_kind": 1}
