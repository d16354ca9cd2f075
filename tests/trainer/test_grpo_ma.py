"""The GRPO-MA loop in one process on the tiny model: it trains, skips bad steps, resumes exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from loop_helpers import overrides, parameters

from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.logprobs import path_log_probs
from vlm_grpoma.trainer.scoring import score_tree


class Poisoned:
    """Returns NaN for the first answer: it must get no advantage while the step still trains."""

    def score(self, completions, records):
        return RewardResult([math.nan] + [0.5] * (len(completions) - 1))


register_reward("test_poisoned", Poisoned)


class Huge:
    """Rewards near float32's limit (3e38, which skipped every step with float32 statistics) and one beyond
    what float64 squares hold (1e300): that one is counted and left out, the others train."""

    def score(self, completions, records):
        return RewardResult([1e300] + [3e38 * (i % 3) for i in range(1, len(completions))])


register_reward("test_huge", Huge)


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def test_trains_k4_m4_with_finite_metrics_and_changes_weights(make_config, data_path):
    trainer = GRPOMATrainer(make_config(*overrides(data_path, "train.steps=2")))
    before = parameters(trainer)
    history = trainer.train()
    after = parameters(trainer)
    assert len(history) == 2 and trainer.step == 2
    for metrics in history:
        for key in (
            "reward/total_mean",
            "reward/test_answer_length_mean",
            "loss/total",
            "train/grad_norm",
            "train/gss_running",
            "time/rollout_s",
            "time/update_s",
            "lengths/thought_mean",
            "answers/parse_rate",
        ):
            assert math.isfinite(metrics[key]), key
        assert metrics["train/skipped_steps"] == 0
        # the transformers rollout samples from the policy being trained: its log-probs are the trainer's
        assert metrics["rollout/logp_mismatch_mean"] < 1e-4
    assert history[0]["train/gss_running"] == pytest.approx(1.0)
    # the run's, at its end
    assert "train/gss10_count" not in history[0] and history[-1]["train/gss10_count"] == 0.0
    assert any(not torch.equal(before[n], after[n]) for n in before)
    lines = trainer.config.logging.output_dir + "/metrics.jsonl"
    logged = [json.loads(line) for line in open(lines)]
    assert [row["step"] for row in logged] == [1, 2] and "reward/format_mean" in logged[0]


def test_m1_runs_as_plain_grpo(make_config, data_path):
    trainer = GRPOMATrainer(
        make_config(*overrides(data_path, "train.steps=1", "rollout.answers_per_thought=1"))
    )
    metrics = trainer.train()[0]
    assert math.isfinite(metrics["loss/total"]) and metrics["train/skipped_steps"] == 0
    # NaN: needs M>=2
    assert metrics["variance/thought_adv_estimate"] != metrics["variance/thought_adv_estimate"]


def test_second_policy_epoch_logs_low_and_high_clipping(make_config, data_path):
    """With two policy epochs and a large step the second epoch's ratios leave the clip range; the logged
    low and high fractions are the two sides of the logged clip fraction."""
    trainer = GRPOMATrainer(
        make_config(
            *overrides(
                data_path,
                "train.steps=1",
                "algorithm.policy_epochs=2",
                "algorithm.kl_beta=0.0",
                "optim.learning_rate=0.05",
                "optim.max_grad_norm=100.0",
            )
        )
    )
    metrics = trainer.train()[0]
    low, high = metrics["loss/clip_low_fraction"], metrics["loss/clip_high_fraction"]
    assert 0.0 <= low <= 1.0 and 0.0 <= high <= 1.0
    assert low + high == pytest.approx(metrics["loss/clip_fraction"]) and metrics["loss/clip_fraction"] > 0


def test_nan_reward_is_counted_and_the_step_still_trains(make_config, data_path):
    config = make_config(
        *overrides(data_path, "train.steps=1"),
        "rewards.weights={test_answer_length: 1.0, test_poisoned: 1.0}",
    )
    trainer = GRPOMATrainer(config)
    before = parameters(trainer)
    metrics = trainer.train()[0]
    assert metrics["train/skipped_steps"] == 0 and metrics["reward/non_finite"] == 1
    assert math.isfinite(metrics["loss/total"]) and math.isfinite(metrics["reward/total_mean"])
    assert any(not torch.equal(before[n], p) for n, p in parameters(trainer).items())


def test_huge_rewards_train_and_an_overflowing_one_is_counted_as_non_finite(make_config, data_path):
    trainer = GRPOMATrainer(
        make_config(*overrides(data_path, "train.steps=1"), "rewards.weights={test_huge: 1.0}")
    )
    before = parameters(trainer)
    metrics = trainer.train()[0]
    assert metrics["train/skipped_steps"] == 0 and metrics["reward/non_finite"] == 1
    assert math.isfinite(metrics["loss/total"]) and metrics["adv/answer_abs_mean"] > 0.5
    assert any(not torch.equal(before[n], p) for n, p in parameters(trainer).items())


def test_non_finite_loss_skips_the_step_leaves_weights_and_is_reported(
    make_config, data_path, monkeypatch, capsys
):
    import vlm_grpoma.trainer.grpo_ma as grpo_ma

    real = grpo_ma.policy_loss

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        out.loss = out.loss * math.inf
        return out

    monkeypatch.setattr(grpo_ma, "policy_loss", poisoned)
    trainer = GRPOMATrainer(make_config(*overrides(data_path, "train.steps=2", "logging.progress_bar=false")))
    before = parameters(trainer)
    assert trainer.run_to_end("reward/total_mean") == 0
    assert all(torch.equal(before[n], p) for n, p in parameters(trainer).items())
    assert trainer.skipped_steps == 2
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .startswith("trained 2 steps (2 skipped: non-finite loss or gradient); last")
    )


def test_four_steps_equal_two_plus_resume_plus_two(make_config, data_path, tmp_path):
    straight = GRPOMATrainer(
        make_config(*overrides(data_path, "train.steps=4", f"logging.output_dir={tmp_path}/a"))
    )
    straight.train()
    first = GRPOMATrainer(
        make_config(*overrides(data_path, "train.steps=2", f"logging.output_dir={tmp_path}/b"))
    )
    first.train()
    resumed = GRPOMATrainer(
        make_config(
            *overrides(
                data_path, "train.steps=4", f"logging.output_dir={tmp_path}/b", "checkpoint.resume=auto"
            )
        )
    )
    assert resumed.step == 2
    resumed.train()
    expected, got = parameters(straight), parameters(resumed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-7, msg=name)


def test_repeated_updates_on_a_fixed_batch_raise_the_advantage_weighted_likelihood(make_config, data_path):
    trainer = GRPOMATrainer(make_config(*overrides(data_path, "optim.learning_rate=3e-3")))
    records = trainer.records[:4]
    tree = trainer._rollout(records)
    rewards = score_tree(tree, records, trainer.adapter, trainer.rewards).rewards
    assert rewards.std() > 0
    advantages = rewards - rewards.mean(dim=(1, 2), keepdim=True)

    def weighted_likelihood() -> float:
        with torch.no_grad():
            logp = path_log_probs(trainer.engine.deepspeed, tree, list(range(4)), trainer.adapter.tokens)
        return float((logp.answer.sum(-1) * advantages).sum())

    values = [weighted_likelihood()]
    for _ in range(4):
        trainer.engine.deepspeed.train()
        trainer._update(tree, trainer._targets(tree, rewards))
        values.append(weighted_likelihood())
    assert all(b > a for a, b in zip(values, values[1:])), values


def test_shared_prefix_and_naive_passes_take_the_same_step(make_config, data_path, tmp_path):
    runs = {}
    for mode in ("shared", "naive"):
        trainer = GRPOMATrainer(
            make_config(
                *overrides(
                    data_path,
                    "train.steps=1",
                    f"train.logprob_pass={mode}",
                    f"logging.output_dir={tmp_path}/{mode}",
                )
            )
        )
        metrics = trainer.train()[0]
        runs[mode] = (parameters(trainer), metrics)
    (shared, m_shared), (naive, m_naive) = runs["shared"], runs["naive"]
    assert m_shared["train/grad_norm"] == pytest.approx(m_naive["train/grad_norm"], rel=1e-4)
    for key in ("loss/total", "loss/policy", "reward/total_mean"):
        assert m_shared[key] == pytest.approx(m_naive[key], abs=1e-6), key
    # Adam's first step is ~lr * sign(g): only coordinates whose gradient is ~0 (rounding-level) may differ.
    differing = sum(int(((shared[n] - naive[n]).abs() > 1e-6).sum()) for n in shared)
    assert differing <= 1e-3 * sum(p.numel() for p in shared.values())


def test_held_out_evaluation_matches_an_independent_greedy_decode(make_config, data_path, tmp_path):
    """eval/<set>/* before step 1, every train.eval_every steps and after the last, equal to greedy decoding
    with the evaluation module's engine scored by the same reward."""
    from vlm_grpoma.datasets.jsonl import read_records
    from vlm_grpoma.eval.grounding import generate_predictions
    from vlm_grpoma.sampling import SamplingParams

    held_out = generate_shapes("detection", 5, tmp_path / "held_out", seed=3, split="test", config=EASY)
    config = make_config(
        *overrides(
            data_path,
            "train.steps=3",
            "train.eval_every=2",
            "train.eval_batch_prompts=2",
            f"data.eval_sets={{held_out: {held_out}, again: {held_out}}}",
        )
    )
    trainer = GRPOMATrainer(config)
    records = read_records(held_out)
    predictions = generate_predictions(
        trainer.engine.module,
        trainer.adapter,
        records,
        SamplingParams.from_config(config.rollout, config.seed, greedy=True),
        batch_size=2,
    )
    expected = sum(min(len(p.answer_text), 40) / 40 for p in predictions) / len(records)
    trainer.train()
    logged = {row["step"]: row for row in map(json.loads, open(f"{config.logging.output_dir}/metrics.jsonl"))}
    assert sorted(logged) == [0, 1, 2, 3]
    assert set(logged[0]) >= {"step", "time/eval_s"} | {
        f"eval/{s}/{k}"
        for s in ("held_out", "again")
        for k in ("records", "parse_rate", "reward_mean", "test_answer_length_mean", "format_mean")
    }
    assert all(key.startswith("eval/") for key in set(logged[0]) - {"step", "time/eval_s"})
    assert logged[0]["eval/held_out/records"] == 5
    assert logged[0]["eval/held_out/test_answer_length_mean"] == pytest.approx(expected, abs=1e-9)
    assert logged[0]["eval/again/reward_mean"] == logged[0]["eval/held_out/reward_mean"]
    assert "eval/held_out/reward_mean" not in logged[1]
    assert "eval/held_out/reward_mean" in logged[2] and "eval/held_out/reward_mean" in logged[3]


def test_held_out_set_without_the_training_task_is_one_line_error(make_config, data_path, tmp_path):
    from vlm_grpoma.errors import DataError

    other = generate_shapes("trajectory", 2, tmp_path / "traj", seed=0, config=EASY)
    with pytest.raises(
        DataError, match=r"^data\.eval_sets\.val: .* has no detection records \(data\.task\)$"
    ):
        GRPOMATrainer(
            make_config(*overrides(data_path, "train.eval_every=1", f"data.eval_sets={{val: {other}}}"))
        )


def test_evaluation_shards_make_equal_rollout_calls_and_add_up_to_one_rank(make_config, data_path, tmp_path):
    """ZeRO-3 gathers parameters around every rollout call, so every rank must make the same calls: shards are
    padded, and the padding is not counted. Two ranks' sums must equal a one-rank evaluation."""
    from vlm_grpoma.datasets.jsonl import read_records
    from vlm_grpoma.sampling import SamplingParams
    from vlm_grpoma.trainer.evaluation import EvalSet, evaluate_sets

    held_out = generate_shapes("detection", 5, tmp_path / "held_out", seed=3, split="test", config=EASY)
    trainer = GRPOMATrainer(make_config(*overrides(data_path)))
    sets = [EvalSet("test", read_records(held_out))]

    class Counting:  # the trainer's real rollout, with its calls counted
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def sample(self, prompts, params):
            self.calls += 1
            return self.inner.sample(prompts, params)

    def run(rank, world):
        counting = Counting(trainer.rollout)
        metrics = evaluate_sets(
            sets,
            counting,
            trainer.adapter,
            trainer.rewards,
            SamplingParams.from_config(trainer.config.rollout, trainer.config.seed, greedy=True),
            rank=rank,
            world_size=world,
            batch_size=2,
        )
        return metrics, counting.calls

    whole, _ = run(0, 1)
    (first, calls0), (second, calls1) = run(0, 2), run(1, 2)
    assert calls0 == calls1 == 2
    assert (first["eval/test/records"], second["eval/test/records"]) == (3, 2)
    for key in ("reward_mean", "test_answer_length_mean", "parse_rate"):
        combined = (first[f"eval/test/{key}"] * 3 + second[f"eval/test/{key}"] * 2) / 5
        assert combined == pytest.approx(whole[f"eval/test/{key}"], abs=1e-6), key
