"""Launch-test fixtures. DeepSpeed's JIT-built communication op lives in the project cache
(``TORCH_EXTENSIONS_DIR``), so only the first test run on a machine pays its ~35 s build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions")
)


@pytest.fixture
def train_config(tiny_model_dir, tmp_path: Path) -> Path:
    """A GRPO-MA run on the tiny Qwen2-VL and 8 shapes images: 2 prompts per step (one per rank at world 2),
    ZeRO-2, checkpoints after steps 2 and 3; its reward ``launch_test_answer_length`` exists in node_worker.py."""
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    data = generate_shapes("detection", 8, tmp_path / "data", seed=0, config=EASY)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_model_dir('qwen2_vl')}, dtype: float32}}\n"
        f"data: {{train_path: {data}}}\n"
        "rollout: {num_thoughts: 2, answers_per_thought: 2, max_thought_tokens: 8, max_answer_tokens: 8}\n"
        "algorithm: {kl_beta: 0.0}\n"
        "rewards: {weights: {launch_test_answer_length: 1.0, format: 0.5}}\n"
        "optim: {learning_rate: 1e-3}\n"
        "train: {steps: 3, prompts_per_step: 2, micro_batch_prompts: 1}\n"
        "deepspeed: {zero_stage: 2}\n"
        "checkpoint: {save_every: 2, keep_last: 2}\n"
        "logging: {progress_bar: false, tensorboard: false}\n"
    )
    return config
