"""Combining configured rewards by weight, with per-reward components and failure counts."""

import pytest

from vlm_grpoma.answers import Box, Boxes, ParseError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards import Completion, build_reward
from vlm_grpoma.rewards.registry import build_rewards

RECORD = Record(
    id="r0",
    image="x.png",
    task="detection",
    prompt="the red square",
    width=100,
    height=100,
    ground_truth=Boxes((Box(10, 10, 50, 50),)),
)


def test_weighted_total_and_prefixed_components():
    good = Completion(
        Boxes((Box(10, 10, 50, 30),)), "<think>it is there</think>", "<answer>[10,10,50,30]</answer>"
    )
    bad = Completion(ParseError("no_answer_tag"), "<think>hmm</think>", "nothing")
    combined = build_rewards({"iou": 2.0, "format": 0.5})
    result = combined.score([good, bad], [RECORD, RECORD])
    iou = build_reward("iou").score([good, bad], [RECORD, RECORD])
    fmt = build_reward("format").score([good, bad], [RECORD, RECORD])
    assert result.total == pytest.approx([2.0 * i + 0.5 * f for i, f in zip(iou.total, fmt.total)])
    assert result.total[0] == pytest.approx(2.0 * 0.5 + 0.5 * 1.0)
    assert result.components["iou"] == iou.total and result.components["format"] == fmt.total
    assert "iou/matched" in result.components
    assert result.failures.get("iou/no_answer_tag") == 1


def test_unknown_reward_name_lists_the_registered_ones():
    with pytest.raises(
        ValueError, match=r"^rewards\.weights\.bleu: unknown reward 'bleu'; registered: .*iou"
    ):
        build_rewards({"bleu": 1.0})
