"""Shared helpers for reward tests: records and completions built from plain values."""

from __future__ import annotations

import pytest

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion


@pytest.fixture
def make_record():
    def make(ground_truth, task="detection", width=640, height=480, rid="r0"):
        return Record(
            id=rid,
            image="img.png",
            task=task,
            prompt="p",
            width=width,
            height=height,
            ground_truth=ground_truth,
        )

    return make


@pytest.fixture
def completions():
    def make(answers, thought="<think>t</think>", answer_text="<answer>x</answer>"):
        return [Completion(a, thought, answer_text) for a in answers]

    return make
