"""`vlm-grpoma sft` and `vlm-grpoma train` as users run them: launch/train.sh with 2 CPU ranks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

REPO = Path(__file__).resolve().parents[2]


def launch(config: Path, *overrides: str, command: str = "train") -> subprocess.CompletedProcess:
    # Not the rendezvous variables of this pytest process's own (in-process) process group.
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env = {**inherited, "CPU_RANKS": "2", "OMP_NUM_THREADS": "1", "COMMAND": command}
    return subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).state_dict()


@pytest.mark.slow
@pytest.mark.launcher
def test_sft_then_grpo_ma_with_held_out_evaluation_under_the_deepspeed_launcher(tiny_path, tmp_path):
    """SFT under ZeRO-3, then GRPO-MA from its checkpoint under ZeRO-3 with 3 held-out records over 2 ranks:
    rank 1 pads its shard so both ranks make the same (ZeRO-3 gathering) rollout calls; the logged count is the
    real 3. (One run carries both: GRPO-MA under ZeRO-2 with the launcher is in tests/launch.)"""
    data = generate_shapes("detection", 8, tmp_path / "data", seed=0, config=EASY)
    held_out = generate_shapes("detection", 3, tmp_path / "held_out", seed=1, split="test", config=EASY)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_path}, dtype: float32}}\n"
        f"data: {{train_path: {data}, eval_sets: {{test: {held_out}}}}}\n"
        "rollout: {num_thoughts: 2, answers_per_thought: 2, max_thought_tokens: 8, max_answer_tokens: 8}\n"
        "algorithm: {kl_beta: 0.0}\n"
        "optim: {learning_rate: 1e-3}\n"
        "train: {steps: 2, prompts_per_step: 4, micro_batch_prompts: 1, eval_batch_prompts: 1}\n"
        "deepspeed: {zero_stage: 3}\n"
        "logging: {progress_bar: false}\n"
    )

    sft = launch(config, f"logging.output_dir={tmp_path / 'sft'}", command="sft")
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    sft_model = tmp_path / "sft" / "checkpoints" / "step-00000002" / "model"
    meta = json.loads((sft_model.parent / "checkpoint.json").read_text())
    assert meta["world_size"] == 2 and meta["zero_stage"] == 3
    before, after = weights(Path(tiny_path)), weights(sft_model)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # ZeRO-3 gathered, trained weights saved

    grpo = launch(
        config,
        "train.eval_every=1",
        f"model.name_or_path={sft_model}",
        f"logging.output_dir={tmp_path / 'grpo'}",
    )
    assert grpo.returncode == 0, grpo.stdout[-3000:] + grpo.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["train/skipped_steps"] == 0 for r in rows[1:])
    assert all(r["eval/test/records"] == 3 and 0 <= r["eval/test/parse_rate"] <= 1 for r in rows)
    assert (tmp_path / "grpo" / "checkpoints" / "step-00000002" / "model" / "model.safetensors").is_file()
