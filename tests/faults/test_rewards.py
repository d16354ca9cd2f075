"""A non-finite reward: no signal for that answer (advantage 0, left out of its group's statistics), counted
over all ranks and warned once per step; the step itself still trains."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fault_runs import launch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer


def trl_nan_aware_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL 1.16 GRPOTrainer (``_generate_and_score_completions``, ``sum_then_normalize``, ``scale_rewards="group"``)
    for completions whose reward is NaN: ``nanmean`` / ``nanstd`` per group (``trl/trainer/utils.py:nanstd``,
    Bessel-corrected), then ``nan_to_num(advantages, nan=0.0)``; re-implemented here from that source."""
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    variance = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)
    std = torch.where(count > 1, variance.sqrt(), torch.full_like(variance, math.nan))
    return torch.nan_to_num((grouped - mean) / (std + 1e-4), nan=0.0).flatten()


@pytest.mark.parametrize("seed", range(4))
def test_m1_with_nan_rewards_equals_trl(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(5, 6, 1, generator=gen)
    rewards[torch.rand(5, 6, 1, generator=gen) < 0.3] = math.nan
    rewards[0, :5] = math.nan  # a group with a single finite reward: no signal at all
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    expected = trl_nan_aware_advantages(rewards.flatten(), 6).view(5, 6)
    torch.testing.assert_close(thought_adv, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(answer_adv[..., 0], expected, rtol=0, atol=1e-6)
    assert torch.equal(thought_adv[0], torch.zeros(6))


def test_thought_value_is_the_mean_of_its_finite_answers_and_an_unscored_thought_gets_zero():
    nan, inf = math.nan, math.inf
    rewards = torch.tensor([[[1.0, nan, 0.0], [0.0, 0.0, 0.0], [nan, inf, nan], [1.0, 1.0, -inf]]])
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    values = torch.tensor([0.5, 0.0, 1.0])  # thoughts 0, 1, 3; thought 2 has no finite answer
    expected = (values - values.mean()) / (values.std() + 1e-4)
    torch.testing.assert_close(thought_adv[0], torch.tensor([expected[0], expected[1], 0.0, expected[2]]))
    finite = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    scaled = (finite - finite.mean()) / (finite.std() + 1e-4)
    flat = answer_adv.flatten()
    assert torch.equal(flat[[1, 6, 7, 8, 11]], torch.zeros(5))  # every non-finite reward: advantage 0
    torch.testing.assert_close(flat[[0, 2, 3, 4, 5, 9, 10]], scaled)


def test_a_nan_reward_is_counted_warned_once_and_the_step_trains(make_config, tmp_path, caplog):
    trainer = GRPOMATrainer(
        make_config(tmp_path / "run", "train.steps=2", "rewards.weights={fault_nan: 1.0}")
    )
    before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
    history = trainer.train()
    # one NaN per scoring call (this rank's 2 prompts x 2 x 2 answers), each step
    assert [m["reward/non_finite"] for m in history] == [1.0, 1.0]
    assert all(m["train/skipped_steps"] == 0 and math.isfinite(m["loss/total"]) for m in history)
    after = dict(trainer.engine.module.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    warnings = [r.getMessage() for r in caplog.records if "non-finite reward" in r.getMessage()]
    assert warnings == [
        f"step {step}: 1 answer(s) got a non-finite reward; they were left out of their groups' statistics "
        "with advantage 0 (reward/non_finite)"
        for step in (1, 2)
    ]


@pytest.mark.slow
@pytest.mark.launcher
def test_non_finite_rewards_are_summed_over_two_ranks(overrides, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    out = tmp_path / "run"
    args = overrides(out, "train.steps=1", "rewards.weights={fault_nan: 1.0}", "train.prompts_per_step=2")
    run = launch(config, *args)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/non_finite"] == 2.0 and row["train/skipped_steps"] == 0
    assert (out / "config.yaml").is_file()


TRL_REWARDS = '''
import json
import os


def reward_len(completions, **kwargs):
    """TRL's GRPO quick-start reward, unchanged: completions close to 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]


def labelled(completions, prompts, ground_truth, id, **kwargs):
    """1 when the answer names the record's label; None (unscorable) for the first record of a call."""
    with open(os.environ["TRL_CALLS"], "a") as f:
        f.write(json.dumps({"n": len(completions), "prompts": prompts, "kwargs": sorted(kwargs)}) + "\\n")
    labels = [gt["boxes"][0]["label"] for gt in ground_truth]
    return [None if i == 0 else float(label in text) for i, (text, label) in enumerate(zip(completions, labels))]
'''


def test_a_trl_reward_trains_unchanged(make_config, tmp_path, monkeypatch):
    """Item 7: TRL-signature functions are called once per scoring call with the texts, the prompts and
    the record fields; None is an unscorable answer (non-finite handling), and the step trains."""
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    monkeypatch.setenv("TRL_CALLS", str(tmp_path / "calls.jsonl"))
    length, labelled = f"{tmp_path}/trl_rewards.py:reward_len", f"{tmp_path}/trl_rewards.py:labelled"
    config = make_config(
        tmp_path / "run",
        "train.steps=1",
        f"rewards.weights={{{length}: 1.0, {labelled}: 0.5}}",
        "logging.samples_every=1",
    )
    trainer = GRPOMATrainer(config)
    before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
    [metrics] = trainer.train()
    assert metrics["train/skipped_steps"] == 0 and math.isfinite(metrics["loss/total"])
    assert metrics["reward/non_finite"] == 1.0  # the one None of the one scoring call
    assert any(not torch.equal(before[n], p) for n, p in trainer.engine.module.named_parameters())
    [call] = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert call["n"] == 2 * 2 * 2  # every answer of the step's 2 prompts x 2 thoughts x 2 answers at once
    train_prompts = {json.loads(line)["prompt"] for line in open(config.data.train_path)}
    assert len(call["prompts"]) == 8 and set(call["prompts"]) <= train_prompts
    assert {"image", "task", "width", "height", "split", "meta"} <= set(call["kwargs"])
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:  # the completion TRL's function saw: thought then answer, as the model wrote them
        assert s[f"rewards/{length}"] == -abs(20 - len(s["thought"] + s["answer"]))


def test_a_reward_that_never_returns_stops_a_one_rank_run_in_one_line(overrides, tmp_path, capsys):
    """#36 L17: ``rewards.options.<name>.timeout_s`` bounds each call of a file reward."""
    from vlm_grpoma import cli

    (tmp_path / "stuck.py").write_text(
        "import time\n\ndef stuck(completion, record):\n    time.sleep(3600)\n"
    )
    name = f"{tmp_path}/stuck.py:stuck"
    (tmp_path / "run.yaml").write_text("{}\n")
    args = overrides(tmp_path / "run", "train.steps=1", f"rewards.weights={{{name}: 1.0}}")
    args.append(f"rewards.options={{{name}: {{timeout_s: 0.5}}}}")
    assert cli.main(["train", "--config", str(tmp_path / "run.yaml"), *args]) == 1
    [line] = [x for x in capsys.readouterr().err.splitlines() if ": error: " in x]
    assert line.startswith(f"vlm-grpoma train: error: reward {name} did not return within 0.5 s for record ")
    assert line.endswith(f"(rewards.options.{name}.timeout_s)")


def test_an_infinite_reward_costs_its_answer_where_trl_zeroes_its_group():
    """TRL leaves out only NaN: an ±inf reward makes the group mean infinite and nan_to_num zeroes every
    advantage of the group. Ours: ±inf and rewards beyond MAX_REWARD_MAGNITUDE are left out like NaN."""
    rewards = torch.tensor([[[math.inf], [1.0], [2.0], [3.0]], [[-math.inf], [1.0], [2.0], [1e300]]])
    assert torch.equal(trl_nan_aware_advantages(rewards.flatten(), 4), torch.zeros(8))
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    rest = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(thought_adv[0, 1:], (rest - rest.mean()) / (rest.std() + 1e-4))
    assert thought_adv[0, 0] == 0.0 and answer_adv[0, 0, 0] == 0.0
    pair = torch.tensor([1.0, 2.0])  # -inf and 1e300 left out: two usable rewards remain
    torch.testing.assert_close(thought_adv[1, 1:3], (pair - pair.mean()) / (pair.std() + 1e-4))
    assert thought_adv[1, 0] == 0.0 and thought_adv[1, 3] == 0.0


def test_reward_statistics_are_float64_and_an_overflowing_reward_is_counted():
    """#36 L16: float32 group statistics overflowed beyond ~1e19 (zero or NaN advantages; at 3e38 every step
    was skipped while reward/non_finite read 0). Rewards are float64 now; one too large for float64's squares
    becomes NaN, so it is left out and counted."""
    from vlm_grpoma.algorithm.advantages import MAX_REWARD_MAGNITUDE
    from vlm_grpoma.trainer.scoring import reward_tensor

    rewards = reward_tensor([3e38, 0.0, 1.5e38, 2e300, math.inf, -1e150], (1, 6, 1))
    assert rewards.dtype == torch.float64
    assert torch.isnan(rewards[0, 3:5, 0]).all() and rewards[0, 5, 0] == -MAX_REWARD_MAGNITUDE
    thought_adv, _ = grpo_ma_advantages(rewards)
    kept = torch.tensor([3e38, 0.0, 1.5e38, -1e150], dtype=torch.float64)
    expected = (kept - kept.mean()) / (kept.std() + 1e-4)
    torch.testing.assert_close(thought_adv[0, [0, 1, 2, 5]], expected, rtol=1e-12, atol=0)
    assert int((~torch.isfinite(rewards)).sum()) == 2  # what reward/non_finite counts
    # the float32 statistics this replaces: the squares overflow and the advantages are NaN
    as32 = torch.tensor([3e38, 0.0, 1.5e38])
    assert not torch.isfinite(as32.std())
