"""Adaptive answers per thought in the GRPO-MA step on the tiny model: the two-phase ragged tree keeps the budget
and the bounds, trains on both log-prob passes, reproduces the uniform step exactly, and resumes exactly."""

from __future__ import annotations

import math

import pytest
import torch
from loop_helpers import overrides, parameters

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.allocation import TwoPhaseValues, neyman_allocation
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.rollout.tree import answers_at
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.scoring import ABSENT
from vlm_grpoma.trainer.step_metrics import PhaseTimer


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 8, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


ADAPTIVE = (
    "rollout.adaptive_answers.enabled=true",
    "rollout.adaptive_answers.first=2",
    "rollout.adaptive_answers.budget=14",
    "rollout.adaptive_answers.min_per_thought=2",
    "rollout.adaptive_answers.max_per_thought=6",
)


def test_two_phase_tree_keeps_budget_bounds_and_the_allocation_of_its_first_rewards(make_config, data_path):
    trainer = GRPOMATrainer(make_config(*overrides(data_path, *ADAPTIVE)))
    batch = trainer._scored(trainer.records[:4], PhaseTimer())
    tree, scored = batch.tree, batch.scored
    counts = tree.answer_counts
    assert tree.shape == (4, 4, 6)
    assert (counts.sum(1) == 14).all() and counts.min() >= 2 and counts.max() <= 6
    # the allocation is Neyman's of the first two answers' rewards (recomputed from the scores)
    expected = neyman_allocation(scored.rewards[:, :, :2], budget=14, min_per_thought=2, max_per_thought=6)
    assert torch.equal(counts, expected)
    assert torch.equal(tree.present, torch.arange(6) < counts.unsqueeze(-1))  # present answers first
    assert torch.equal(tree.answer_lengths > 0, tree.present)
    # every present answer scored (a length reward is never NaN), every absent slot unscored
    assert torch.isfinite(scored.rewards[tree.present]).all() and scored.rewards[~tree.present].isnan().all()
    absent = [c.answer is ABSENT for c in scored.completions]
    assert torch.equal(torch.tensor(absent).view(4, 4, 6), ~tree.present)
    for b in range(4):
        for k in range(4):
            for m in range(int(counts[b, k])):
                text = tree.thought_texts[b][k] + tree.answer_texts[b][k][m]
                assert scored.completions[scored.index(b, k, m)].answer_text == tree.answer_texts[b][k][m]
                assert text.startswith(tree.thought_texts[b][k])


def test_the_step_trains_thoughts_on_the_unbiased_two_phase_values(make_config, data_path):
    """The thought advantages normalise w·(first answers' mean) + (1 − w)·(extra answers' mean), w = 2 / 3.5,
    not the plain mean of a thought's answers (biased: the first answers chose how many more it got)."""
    trainer = GRPOMATrainer(make_config(*overrides(data_path, *ADAPTIVE)))
    batch = trainer._scored(trainer.records[:4], PhaseTimer())
    tree, rewards = batch.tree, batch.scored.rewards
    targets = trainer._targets(tree, rewards)
    values = TwoPhaseValues(first=2, first_weight=2 / 3.5).values(rewards, tree.answer_present)
    expected, _ = grpo_ma_advantages(rewards, answer_mask=tree.answer_present, values=values)
    torch.testing.assert_close(targets.thought_adv, expected, rtol=0, atol=0)
    plain, _ = grpo_ma_advantages(rewards, answer_mask=tree.answer_present)
    assert not torch.equal(plain, expected)


@pytest.mark.parametrize("logprob_pass", ["shared", "naive"])
def test_adaptive_step_trains_and_logs_its_allocation(make_config, data_path, logprob_pass):
    trainer = GRPOMATrainer(
        make_config(*overrides(data_path, *ADAPTIVE, "train.steps=1", f"train.logprob_pass={logprob_pass}"))
    )
    before = parameters(trainer)
    metrics = trainer.train()[0]
    assert metrics["train/skipped_steps"] == 0 and math.isfinite(metrics["loss/total"])
    assert metrics["answers/per_thought_mean"] == 14 / 4
    assert 2 <= metrics["answers/per_thought_min"] <= metrics["answers/per_thought_max"] <= 6
    ratio = metrics["answers/predicted_var_ratio"]
    # Neyman's never predicts more than the uniform 3.5 answers each, up to rounding: 4 does not divide 14
    assert math.isnan(ratio) or 0 < ratio <= 1.05
    assert metrics["rollout/logp_mismatch_mean"] < 1e-4  # the extra answers' log-probs are the trainer's
    assert metrics["reward/non_finite"] == 0  # absent slots are not answers
    assert any(not torch.equal(before[n], p) for n, p in parameters(trainer).items())


def test_adaptive_with_equal_bounds_takes_the_uniform_step_exactly(make_config, data_path, tmp_path):
    """first = min = max = M: one phase of M answers (the same seed), nothing allocated; loss, gradient
    norm and weights equal the plain K x M step's."""
    runs = {}
    for name, extra in {
        "uniform": ("rollout.answers_per_thought=4",),
        "adaptive": (
            "rollout.adaptive_answers.enabled=true",
            "rollout.adaptive_answers.first=4",
            "rollout.adaptive_answers.budget=16",
            "rollout.adaptive_answers.min_per_thought=4",
            "rollout.adaptive_answers.max_per_thought=4",
        ),
    }.items():
        trainer = GRPOMATrainer(
            make_config(
                *overrides(data_path, *extra, "train.steps=1", f"logging.output_dir={tmp_path}/{name}")
            )
        )
        runs[name] = (trainer.train()[0], parameters(trainer))
    (m_uniform, uniform), (m_adaptive, adaptive) = runs["uniform"], runs["adaptive"]
    for key in ("loss/total", "loss/policy", "train/grad_norm", "reward/total_mean"):
        assert m_adaptive[key] == m_uniform[key], key
    assert all(torch.equal(adaptive[n], uniform[n]) for n in uniform)


@pytest.mark.parametrize("logprob_pass", ["shared", "naive"])
def test_an_absent_answer_slot_changes_no_loss_and_no_gradient(
    make_config, data_path, tmp_path, logprob_pass
):
    """The uniform tree and the same tree with a fifth, absent answer slot per thought (the ragged layout:
    mask, NaN rewards, zero-token answers) give the same loss and gradients through the whole update."""
    results = []
    for ragged in (False, True):
        trainer = GRPOMATrainer(
            make_config(
                *overrides(
                    data_path,
                    "rollout.answers_per_thought=4",
                    f"train.logprob_pass={logprob_pass}",
                    f"logging.output_dir={tmp_path}/{ragged}",
                )
            )
        )
        batch = trainer._scored(trainer.records[:4], PhaseTimer())
        tree, rewards = batch.tree, batch.scored.rewards
        if ragged:
            empty = answers_at(
                tree,
                [],
                0,
                ids=torch.zeros(0, 8).long(),
                mask=torch.zeros(0, 8).bool(),
                logprobs=torch.zeros(0, 8),
                finish=[],
                texts=[],
            )
            tree = tree.with_answers(empty, width=5)
            rewards = torch.nn.functional.pad(rewards, (0, 1), value=math.nan)
            assert tree.shape == (4, 4, 5) and not tree.present[..., 4].any()
        update, grad_norm = trainer._update(tree, trainer._targets(tree, rewards))
        results.append((update, grad_norm, parameters(trainer)))
    (u_plain, g_plain, p_plain), (u_ragged, g_ragged, p_ragged) = results
    assert g_ragged == pytest.approx(g_plain, rel=1e-6)
    for key in ("loss/total", "loss/policy", "adv/thought_abs_mean", "adv/answer_abs_mean"):
        assert u_ragged[key] == pytest.approx(u_plain[key], rel=1e-6, abs=1e-9), key
    for name in p_plain:
        torch.testing.assert_close(p_ragged[name], p_plain[name], rtol=0, atol=1e-6, msg=name)


def test_adaptive_two_steps_equal_one_plus_resume_plus_one(make_config, data_path, tmp_path):
    def run(folder: str, steps: int, *extra: str) -> GRPOMATrainer:
        trainer = GRPOMATrainer(
            make_config(
                *overrides(
                    data_path, *ADAPTIVE, f"train.steps={steps}", f"logging.output_dir={tmp_path}/{folder}"
                ),
                *extra,
            )
        )
        trainer.train()
        return trainer

    straight = run("a", 2)
    run("b", 1)
    resumed = run("b", 2, "checkpoint.resume=auto")
    expected, got = parameters(straight), parameters(resumed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-7, msg=name)


def test_dynamic_sampling_refills_with_ragged_trees(make_config, data_path):
    """Refill rounds roll out two-phase trees too; the kept prompts' trees concatenate with their masks."""
    trainer = GRPOMATrainer(
        make_config(
            *overrides(
                data_path,
                *ADAPTIVE,
                "train.steps=1",
                "algorithm.dynamic_sampling.enabled=true",
                "rewards.weights={format: 1.0}",
            )
        )
    )
    batch, _, _ = trainer._step_batch(PhaseTimer())
    counts = batch.tree.answer_counts
    assert 1 <= batch.size <= 4 and (counts.sum(1) == 14).all()
    assert torch.equal(batch.tree.present, torch.arange(6) < counts.unsqueeze(-1))
    assert torch.equal(batch.scored.rewards.isnan(), ~batch.tree.present)
