"""Trainer fixtures: DeepSpeed's JIT cache inside the project, one torch thread, configs on the tiny model."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_path(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen2_vl")


@pytest.fixture
def make_config(tiny_path: Path, tmp_path: Path) -> Callable[..., object]:
    """``make_config("key=value", ...)`` → a validated Config training the tiny model into ``tmp_path``."""
    from vlm_grpoma.config import load_config

    def make(*overrides: str):
        base = [
            f"model.name_or_path={tiny_path}",
            f"logging.output_dir={tmp_path / 'run'}",
            "train.steps=4",
            "train.prompts_per_step=4",
            "train.micro_batch_prompts=2",
            "algorithm.kl_beta=0",
            "optim.learning_rate=1e-3",
            "deepspeed.zero_stage=0",
            "seed=0",
        ]
        return load_config(None, [*base, *overrides])

    return make
