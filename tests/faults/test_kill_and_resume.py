"""kill -9 in the middle of a step and in the middle of a checkpoint save, then ``checkpoint.resume=auto``:
the final model is bitwise-equal to an uninterrupted run and every step appears once in metrics.jsonl."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from fault_runs import model_weights, run_cli

from vlm_grpoma.trainer.checkpoint import list_checkpoints
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

REWARDS = "rewards.weights={fault_length: 1.0, fault_kill: 0.0}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_path, shapes_path):
    """4 uninterrupted steps, as the final Hugging Face weights."""
    from fault_runs import BASE

    from vlm_grpoma.config import load_config

    out = tmp_path_factory.mktemp("straight") / "run"
    overrides = [
        f"model.name_or_path={tiny_path}",
        f"data.train_path={shapes_path}",
        f"logging.output_dir={out}",
    ]
    GRPOMATrainer(load_config(None, [*overrides, *BASE, REWARDS, "train.steps=4"])).train()
    return model_weights(out / "checkpoints" / "step-00000004" / "model")


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment,env",
    [
        ("mid-step 3", {"KILL_AT_CALL": "3"}),
        ("mid-save of step 3", {"FAULT": "kill-in-save:3"}),
    ],
)
def test_kill_9_then_resume_auto_is_bitwise_equal_and_logs_each_step_once(
    moment, env, overrides, straight, tmp_path
):
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    args = overrides(out, REWARDS, "checkpoint.save_every=1", "checkpoint.keep_last=3")
    killed = run_cli("train", "--config", str(config), *args, "train.steps=4", env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [p.name for p in list_checkpoints(out)] == ["step-00000001", "step-00000002"]

    resumed = run_cli("train", "--config", str(config), *args, "train.steps=4", "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.splitlines()[-1].startswith("trained 4 steps; last reward/total_mean")
    got = model_weights(out / "checkpoints" / "step-00000004" / "model")
    assert got.keys() == straight.keys()
    assert all(torch.equal(got[name], value) for name, value in straight.items()), moment
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], moment
    assert not list((out / "checkpoints").glob(".tmp-*"))
