"""The step's metrics, in one process: reward statistics over finite rewards, group signal, phase timings."""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.trainer.step_metrics import (
    PhaseTimer,
    global_reward_metrics,
    reward_metrics,
    zero_thought_variance_fraction,
)


def test_reward_mean_and_std_skip_non_finite_rewards_and_warn_once(caplog):
    rewards = torch.tensor([[[1.0, math.nan], [3.0, math.inf]], [[0.0, 2.0], [4.0, 5.0]]])
    finite = [1.0, 3.0, 0.0, 2.0, 4.0, 5.0]
    with caplog.at_level(logging.WARNING):
        metrics = global_reward_metrics(rewards, {"no_answer": 2.0}, 60.0, step=7, is_main=True)
    mean = sum(finite) / len(finite)
    assert metrics["reward/total_mean"] == pytest.approx(mean)
    # population std over the finite rewards (ranks' sums and squares added up)
    assert metrics["reward/total_std"] == pytest.approx(
        math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    )
    assert metrics["reward/non_finite"] == 2.0 and metrics["failures/no_answer"] == 2.0
    assert [r.getMessage() for r in caplog.records] == [
        "step 7: 2 answer(s) got a non-finite reward; they were left out of their groups' statistics with "
        "advantage 0 (reward/non_finite)"
    ]


def test_no_finite_reward_gives_nan_statistics_not_an_error():
    metrics = global_reward_metrics(torch.full((1, 2, 2), math.nan), {}, 60.0, step=1, is_main=False)
    assert math.isnan(metrics["reward/total_mean"]) and math.isnan(metrics["reward/total_std"])
    assert metrics["reward/non_finite"] == 4.0


def test_zero_thought_variance_counts_prompts_without_two_distinct_thought_values():
    rewards = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0]],  # thought values 0.5 and 0.5: no thought signal
            [[1.0, 1.0], [0.0, 1.0]],  # 1.0 and 0.5: signal
            [[math.nan, math.nan], [1.0, 0.0]],  # one finite thought value only
        ]
    )
    assert zero_thought_variance_fraction(rewards) == pytest.approx(2 / 3)


def test_reward_metrics_report_parse_rate_and_component_means():
    rewards = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    result = RewardResult(total=[1.0, 0.0, 1.0, 1.0], components={"iou": [0.5, math.nan, 0.25, 0.0]})
    metrics = reward_metrics(rewards, torch.tensor([[[True, False], [True, True]]]), result)
    assert metrics["answers/parse_rate"] == 0.75
    assert metrics["reward/iou_mean"] == 0.25  # NaN components (unscorable) are left out
    assert metrics["groups/zero_thought_variance"] == 0.0


def test_phase_timer_times_each_phase_inside_the_total():
    timer = PhaseTimer()
    with timer("rollout"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError), timer("update"):
        raise RuntimeError("a failing phase is still timed")
    assert set(timer.metrics()) == {"time/rollout_s", "time/update_s"}
    assert timer.seconds["rollout"] >= 0.01
    assert timer.elapsed() >= timer.seconds["rollout"] + timer.seconds["update"]
