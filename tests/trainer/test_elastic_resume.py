"""Elastic resume: a run saved by 2 ranks continues on 1 rank and back on 2 (real ``deepspeed`` launcher, ZeRO 2 and
3 through DeepSpeed's universal checkpoint), keeping weights, Adam moments and step, schedule and data position
bit for bit; and the one-line refusals of what cannot carry over."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.distributed import free_port
from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.trainer.elastic import plan_resume

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("elastic_worker.py")


def _launch(config: Path, ranks: int, tag: str, *overrides: str) -> subprocess.CompletedProcess:
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
    }
    env = {
        **inherited,
        "CPU_RANKS": str(ranks),
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "TRAIN_SCRIPT": str(WORKER),
        "ELASTIC_TAG": tag,
    }
    run = subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _assert_same_state(resumed: dict, saved: dict) -> None:
    """Bit-equal: the conversion only cuts and joins the saved fp32 tensors, it computes nothing."""
    assert resumed["params"].keys() == saved["params"].keys() and saved["params"]
    for name, tensors in saved["params"].items():
        for key, value in tensors.items():
            assert torch.equal(resumed["params"][name][key], value), f"{name} {key}"
    for key in ("adam_steps", "global_steps", "lr_epoch", "trainer_step", "data"):
        assert resumed[key] == saved[key], key


def _config(tmp_path: Path, tiny_path: Path, stage: int) -> Path:
    data = generate_shapes("detection", 8, tmp_path / "data", seed=0, config=EASY)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_path}, dtype: float32}}\n"
        f"data: {{train_path: {data}}}\n"
        "rollout: {num_thoughts: 2, answers_per_thought: 2, max_thought_tokens: 4, max_answer_tokens: 4}\n"
        "algorithm: {kl_beta: 0.0}\n"
        "optim: {learning_rate: 1e-3, lr_scheduler: linear}\n"
        "train: {steps: 6, prompts_per_step: 4, micro_batch_prompts: 1}\n"
        f"deepspeed: {{zero_stage: {stage}}}\n"
        f"logging: {{progress_bar: false, output_dir: {tmp_path / 'run'}}}\n"
        "checkpoint: {resume: auto}\n"
    )
    return config


def _state(out: Path, name: str) -> dict:
    return torch.load(out / f"state-{name}.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.launcher
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_to_one_to_two_keeps_the_optimizer_state_exactly(tiny_path, tmp_path, stage):
    config, out = _config(tmp_path, tiny_path, stage=stage), tmp_path / "run"
    _launch(config, 2, "a", "train.steps=1")
    one = _launch(config, 1, "b", "train.steps=2")
    assert f"elastic resume from 2 ranks/ZeRO {stage} to 1 rank/ZeRO {stage}" in one.stdout + one.stderr
    step1 = out / "checkpoints" / "step-00000001"
    assert json.loads((step1 / "universal" / "checkpoint.json").read_text())["source_sha256"]
    _assert_same_state(_state(out, "b-started"), _state(out, "a-trained"))
    two = _launch(config, 2, "c", "train.steps=3")
    assert f"elastic resume from 1 rank/ZeRO {stage} to 2 ranks/ZeRO {stage}" in two.stdout + two.stderr
    _assert_same_state(_state(out, "c-started"), _state(out, "b-trained"))

    trained = [_state(out, f"{phase}-trained") for phase in "abc"]
    assert [s["trainer_step"] for s in trained] == [1, 2, 3]
    assert [s["adam_steps"] for s in trained] == [[1], [2], [3]]
    assert [s["global_steps"] for s in trained] == [1, 2, 3] == [s["lr_epoch"] for s in trained]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # training proceeds: finite loss and gradient (a non-finite one is a skipped step), on every step
    assert all(r["train/skipped_steps"] == 0 and math.isfinite(r["train/grad_norm"]) for r in rows)
    # the global data order of an uninterrupted run: 3 steps of 4 prompts over 8 records
    assert trained[-1]["data"] == {"epoch": 1, "position": 4, "seed": 0, "num_records": 8}


@pytest.mark.slow
@pytest.mark.launcher
def test_zero0_resumes_on_another_world_size_without_conversion(tiny_path, tmp_path):
    config, out = _config(tmp_path, tiny_path, stage=0), tmp_path / "run"
    _launch(config, 2, "a", "train.steps=1")
    one = _launch(config, 1, "b", "train.steps=2")
    assert (
        "elastic resume from 2 ranks/ZeRO 0 to 1 rank/ZeRO 0 through its unpartitioned"
        in one.stdout + one.stderr
    )
    assert not (out / "checkpoints" / "step-00000001" / "universal").exists()
    _assert_same_state(_state(out, "b-started"), _state(out, "a-trained"))
    assert _state(out, "b-trained")["adam_steps"] == [2]


META = {"step": 2, "world_size": 2, "zero_stage": 2}


@pytest.mark.parametrize(
    ("saved", "world", "stage", "elastic", "message"),
    [
        ({"zero_stage": 0}, 2, 2, True, r"saved with ZeRO stage 0, resuming with deepspeed.zero_stage=2; "),
        ({}, 2, 3, True, r"from ZeRO 1/2 to ZeRO 3: set deepspeed.zero_stage=2 \(any world size\)"),
        ({"zero_stage": 3}, 1, 1, True, r"from ZeRO 3 to ZeRO 1/2"),
        ({}, 1, 2, False, r"elastic_resume=false asks for an exact resume: resume with 2 ranks"),
    ],
)
def test_what_cannot_carry_over_is_one_line(saved, world, stage, elastic, message, tmp_path):
    with pytest.raises(CheckpointError, match=message) as refused:
        plan_resume(tmp_path, {**META, **saved}, world, stage, elastic=elastic, tag="state")
    assert str(tmp_path) in str(refused.value) and "\n" not in str(refused.value)


def test_zero0_fp32_and_unchanged_runs_need_no_conversion(tmp_path):
    (tmp_path / "deepspeed" / "state").mkdir(parents=True)
    (tmp_path / "deepspeed" / "state" / "mp_rank_00_model_states.pt").touch()
    zero0 = plan_resume(tmp_path, {**META, "zero_stage": 0}, 1, 0, elastic=True, tag="state")
    assert zero0.elastic and not zero0.universal
    (tmp_path / "deepspeed" / "state" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").touch()
    same = plan_resume(tmp_path, META, 2, 2, elastic=False, tag="state")
    assert not same.elastic and not same.universal
    assert plan_resume(tmp_path, META, 1, 1, elastic=True, tag="state").universal
