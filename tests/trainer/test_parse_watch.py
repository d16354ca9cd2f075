"""The parse-rate warning: once per rate, the first time the training rate (5-step means) or a held-out set's
rate (each evaluation against the first) falls more than 20 points below its start."""

from __future__ import annotations

import logging

import pytest

from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.parse_watch import ParseRateWatch


def feed(watch: ParseRateWatch, rates: list[float], name: str = "answers/parse_rate") -> dict[int, list[str]]:
    return {step: lines for step, rate in enumerate(rates, 1) if (lines := watch.observe(step, {name: rate}))}


def test_the_training_rate_warns_once_when_its_5_step_mean_falls_over_20_points():
    # start: mean of steps 1-5 = 0.96; the mean of steps 5-9 reaches 0.74 (a 22-point fall) at step 9
    warned = feed(ParseRateWatch(), [1.0, 0.9, 1.0, 0.9, 1.0, 0.7, 0.7, 0.6, 0.7, 0.0, 0.0])
    assert list(warned) == [9]
    assert warned[9] == [
        "step 9: the training parse rate (mean of 5 steps) fell from 0.96 to 0.74: answers are drifting from the "
        "format the reward can read (look at samples.jsonl; a format reward weight or a KL anchor holds it)"
    ]


def test_noise_and_a_fall_of_exactly_20_points_do_not_warn():
    assert feed(ParseRateWatch(), [1.0, 0.6, 1.0, 1.0, 1.0, 0.6, 1.0, 0.6, 0.9]) == {}
    assert feed(ParseRateWatch(), [1.0] * 5 + [0.8] * 10) == {}


def test_a_held_out_rate_is_judged_against_its_first_evaluation_and_other_metrics_are_ignored():
    watch = ParseRateWatch()
    assert watch.observe(0, {"eval/unseen/parse_rate": 1.0, "eval/unseen/reward_mean": 0.5}) == []
    assert watch.observe(20, {"eval/unseen/parse_rate": 0.85, "reward/mean": 0.0}) == []
    (line,) = watch.observe(40, {"eval/unseen/parse_rate": 0.5, "eval/seen/parse_rate": 1.0})
    assert line.startswith("step 40: held-out 'unseen' parse rate fell from 1.00 to 0.50: ")
    assert watch.observe(60, {"eval/unseen/parse_rate": 0.0}) == []  # once per rate


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def test_a_training_run_prints_the_warning(make_config, data_path, monkeypatch, caplog):
    """The real trainer feeds its logged metrics to the watch; only the rates it reports are scripted."""
    rates = iter([1.0] * 5 + [0.5] * 3)
    real_step = GRPOMATrainer.train_step

    def scripted(self):
        return real_step(self) | {"answers/parse_rate": next(rates)}

    monkeypatch.setattr(GRPOMATrainer, "train_step", scripted)
    trainer = GRPOMATrainer(
        make_config(
            f"data.train_path={data_path}",
            "rollout.max_thought_tokens=4",
            "rollout.max_answer_tokens=4",
            "train.steps=8",
        )
    )
    with caplog.at_level(logging.WARNING, logger="vlm_grpoma.trainer.base"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "parse rate" in r.getMessage()]
    assert warnings == [
        "step 8: the training parse rate (mean of 5 steps) fell from 1.00 to 0.70: answers are drifting from the "
        "format the reward can read (look at samples.jsonl; a format reward weight or a KL anchor holds it)"
    ]
