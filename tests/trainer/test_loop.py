"""The GRPO-MA loop in one process on the tiny model: it trains, skips bad steps, resumes exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.rewards.base import RewardResult, register_reward
from vlm_grpoma.trainer.logprobs import path_log_probs
from vlm_grpoma.trainer.loop import Trainer, score_tree


@register_reward("test_answer_length")
class AnswerLength:
    """Longer answers score more: a reward a random tiny model's samples actually vary on."""

    name = "test_answer_length"

    def score(self, completions, records):
        total = [min(len(c.answer_text), 40) / 40 for c in completions]
        return RewardResult(total, {"chars": [float(len(c.answer_text)) for c in completions]})


@register_reward("test_poisoned")
class Poisoned:
    """Returns NaN for one answer: the step must be skipped, not applied."""

    name = "test_poisoned"

    def score(self, completions, records):
        return RewardResult([math.nan] + [0.5] * (len(completions) - 1))


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def overrides(data_path, *extra):
    return (f"data.train_path={data_path}", "rewards.weights={test_answer_length: 1.0, format: 0.5}",
            "rollout.num_thoughts=4", "rollout.answers_per_thought=4", "rollout.max_thought_tokens=12",
            "rollout.max_answer_tokens=8", *extra)


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}


def test_trains_k4_m4_with_finite_metrics_and_changes_weights(make_config, data_path):
    trainer = Trainer(make_config(*overrides(data_path, "train.steps=2")))
    before = parameters(trainer)
    history = trainer.train()
    after = parameters(trainer)
    assert len(history) == 2 and trainer.step == 2
    for metrics in history:
        for key in ("reward/total_mean", "reward/test_answer_length_mean", "loss/total", "train/grad_norm",
                    "train/gss", "time/rollout_s", "time/update_s", "lengths/thought_mean", "answers/parse_rate"):
            assert math.isfinite(metrics[key]), key
        assert metrics["train/skipped_steps"] == 0
        # the transformers rollout samples from the policy being trained: its log-probs are the trainer's
        assert metrics["rollout/logp_mismatch_mean"] < 1e-4
    assert history[0]["train/gss"] == pytest.approx(1.0)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    lines = (trainer.config.logging.output_dir + "/metrics.jsonl")
    logged = [json.loads(line) for line in open(lines)]
    assert [row["step"] for row in logged] == [1, 2] and "reward/format_mean" in logged[0]


def test_m1_runs_as_plain_grpo(make_config, data_path):
    trainer = Trainer(make_config(*overrides(data_path, "train.steps=1", "rollout.answers_per_thought=1")))
    metrics = trainer.train()[0]
    assert math.isfinite(metrics["loss/total"]) and metrics["train/skipped_steps"] == 0
    assert metrics["variance/thought_adv_estimate"] != metrics["variance/thought_adv_estimate"]  # NaN: needs M>=2


def test_nan_reward_skips_the_step_and_leaves_weights(make_config, data_path):
    config = make_config(*overrides(data_path, "train.steps=1"),
                         "rewards.weights={test_answer_length: 1.0, test_poisoned: 1.0}")
    trainer = Trainer(config)
    before = parameters(trainer)
    metrics = trainer.train()[0]
    assert metrics["train/skipped_steps"] == 1 and metrics["reward/non_finite"] == 1
    assert all(torch.equal(before[n], p) for n, p in parameters(trainer).items())


def test_four_steps_equal_two_plus_resume_plus_two(make_config, data_path, tmp_path):
    straight = Trainer(make_config(*overrides(data_path, "train.steps=4", f"logging.output_dir={tmp_path}/a")))
    straight.train()
    first = Trainer(make_config(*overrides(data_path, "train.steps=2", f"logging.output_dir={tmp_path}/b")))
    first.train()
    resumed = Trainer(make_config(*overrides(data_path, "train.steps=4", f"logging.output_dir={tmp_path}/b",
                                             "checkpoint.resume=auto")))
    assert resumed.step == 2
    resumed.train()
    expected, got = parameters(straight), parameters(resumed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-7, msg=name)


def test_repeated_updates_on_a_fixed_batch_raise_the_advantage_weighted_likelihood(make_config, data_path):
    trainer = Trainer(make_config(*overrides(data_path, "optim.learning_rate=3e-3")))
    records = trainer.records[:4]
    tree = trainer._rollout(records)
    _, rewards, _ = score_tree(tree, records, trainer.adapter, trainer.rewards)
    assert rewards.std() > 0
    advantages = rewards - rewards.mean(dim=(1, 2), keepdim=True)

    def weighted_likelihood() -> float:
        with torch.no_grad():
            logp = path_log_probs(trainer.engine.model, tree, list(range(4)), trainer.adapter.tokens)
        return float((logp.answer.sum(-1) * advantages).sum())

    values = [weighted_likelihood()]
    for _ in range(4):
        trainer.engine.model.train()
        trainer._update(tree, rewards)
        values.append(weighted_likelihood())
    assert all(b > a for a, b in zip(values, values[1:])), values


def test_shared_prefix_and_naive_passes_take_the_same_step(make_config, data_path, tmp_path):
    runs = {}
    for mode in ("shared", "naive"):
        trainer = Trainer(make_config(*overrides(data_path, "train.steps=1", f"train.logprob_pass={mode}",
                                                 f"logging.output_dir={tmp_path}/{mode}")))
        metrics = trainer.train()[0]
        runs[mode] = (parameters(trainer), metrics)
    (shared, m_shared), (naive, m_naive) = runs["shared"], runs["naive"]
    assert m_shared["train/grad_norm"] == pytest.approx(m_naive["train/grad_norm"], rel=1e-4)
    for key in ("loss/total", "loss/policy", "reward/total_mean"):
        assert m_shared[key] == pytest.approx(m_naive[key], abs=1e-6), key
    # Adam's first step is ~lr * sign(g): only coordinates whose gradient is ~0 (rounding-level) may differ.
    differing = sum(int(((shared[n] - naive[n]).abs() > 1e-6).sum()) for n in shared)
    assert differing <= 1e-3 * sum(p.numel() for p in shared.values())
