"""Dynamic sampling: prompts whose K·M rewards are all equal are replaced by fresh ones; resume stays exact."""

from __future__ import annotations

import math
import zlib

import pytest
import torch
from length_reward import AnswerLength

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward
from vlm_grpoma.trainer.dynamic_sampling import informative_prompts
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.step_metrics import PhaseTimer


def constant_record(record_id: str) -> bool:
    return zlib.crc32(record_id.encode()) % 2 == 0


class HalfConstant:
    """Half of the records (by a hash of the id) score 0.5 whatever the answer; the rest score answer length."""

    def score(self, completions, records):
        varying = AnswerLength().score(completions, records).total
        return RewardResult([0.5 if constant_record(r.id) else v for v, r in zip(varying, records)])


register_reward("test_half_constant", HalfConstant)


def test_informative_prompts_need_two_distinct_finite_rewards():
    nan = math.nan
    rewards = torch.tensor(
        [
            [[1.0, 1.0], [1.0, 1.0]],  # all equal
            [[1.0, 0.0], [1.0, 1.0]],  # signal
            [[nan, 0.3], [0.3, nan]],  # equal finite rewards
            [[nan, nan], [nan, nan]],  # nothing finite
            [[nan, 0.3], [0.2, nan]],  # signal among the finite ones
        ]
    )
    assert informative_prompts(rewards) == [1, 4]


def test_a_prompt_is_informative_exactly_when_its_advantages_are_not_all_zero():
    """The same rule as the advantages: a reward beyond 1e150 carries no signal in either place."""
    nan, inf = math.nan, math.inf
    rewards = torch.tensor(
        [
            [[1e200, 0.0], [0.0, 0.0]],  # the huge reward is left out: the rest are equal
            [[-1e151, 0.5], [0.5, nan]],
            [[inf, 0.0], [1.0, 0.0]],
            [[1e150, 0.0], [0.0, 0.0]],  # 1e150 itself still counts
            [[0.2, 0.2], [0.2, 0.2]],
        ],
        dtype=torch.float64,
    )
    thought, answer = grpo_ma_advantages(rewards)
    with_signal = ((thought != 0).any(-1) | (answer != 0).flatten(1).any(-1)).nonzero().flatten().tolist()
    assert informative_prompts(rewards) == with_signal == [2, 3]


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 16, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def overrides(data_path, *extra):
    return (
        f"data.train_path={data_path}",
        "rewards.weights={test_half_constant: 1.0}",
        "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2",
        "rollout.max_thought_tokens=8",
        "rollout.max_answer_tokens=6",
        "algorithm.dynamic_sampling.enabled=true",
        "algorithm.dynamic_sampling.max_rounds=6",
        *extra,
    )


def test_a_step_is_filled_with_informative_prompts_when_half_are_constant(make_config, data_path):
    trainer = GRPOMATrainer(make_config(*overrides(data_path)))
    batch, metrics, _ = trainer._step_batch(PhaseTimer())
    assert batch.size == 4  # train.prompts_per_step
    assert not any(constant_record(r.id) for r in batch.records)
    assert informative_prompts(batch.scored.rewards) == [0, 1, 2, 3]
    assert metrics["groups/refill_rounds"] >= 1
    assert 0 < metrics["groups/filtered_fraction"] < 1
    assert trainer.sampler.position + trainer.sampler.epoch * 16 == 4 * (1 + metrics["groups/refill_rounds"])
    # the batch's parts stay aligned: the reward of each kept answer is its record's
    per_prompt = 4
    for b, record in enumerate(batch.records):
        kept = batch.scored.result.total[b * per_prompt : (b + 1) * per_prompt]
        assert kept == pytest.approx(batch.scored.rewards[b].flatten().tolist())
        assert batch.tree.prompts[b].record.id == record.id
        assert all(
            c.thought_text in batch.tree.thought_texts[b] for c in batch.scored.completions[b * 4 : b * 4 + 4]
        )
    trainer.engine.close()


def test_when_rounds_run_out_the_step_trains_on_what_it_has(make_config, data_path):
    trainer = GRPOMATrainer(
        make_config(
            *overrides(data_path, "algorithm.dynamic_sampling.max_rounds=1", "train.prompts_per_step=8")
        )
    )
    batch, metrics, _ = trainer._step_batch(PhaseTimer())
    assert metrics["groups/refill_rounds"] == 1
    assert 0 < batch.size <= 8 and not any(constant_record(r.id) for r in batch.records)
    trainer.engine.close()


@pytest.mark.slow
def test_resume_mid_run_with_dynamic_sampling_equals_the_straight_run(make_config, data_path, tmp_path):
    def run(*extra):
        trainer = GRPOMATrainer(make_config(*overrides(data_path, *extra)))
        trainer.train()
        return trainer

    straight = run("train.steps=3", f"logging.output_dir={tmp_path}/a")
    run("train.steps=1", f"logging.output_dir={tmp_path}/b")
    resumed = run("train.steps=3", f"logging.output_dir={tmp_path}/b", "checkpoint.resume=auto")
    expected = dict(straight.engine.module.named_parameters())
    for name, value in resumed.engine.module.named_parameters():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-7, msg=name)
    assert resumed.sampler.state_dict() == straight.sampler.state_dict()
