"""Helpers of the fault suite: the shared run settings, and the CLI run as users run it (a subprocess, or
``launch/train.sh`` with 2 CPU ranks), through ``fault_cli.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
FAULT_CLI = Path(__file__).with_name("fault_cli.py")
#: Subprocesses import the suite from this checkout (or from where PYTHONPATH already points).
PYTHONPATH = os.environ.get("PYTHONPATH") or str(REPO)

#: Settings every fault run shares: the tiny model trains a few fast steps into ``logging.output_dir``.
BASE = (
    "rollout.num_thoughts=2",
    "rollout.answers_per_thought=2",
    "rollout.max_thought_tokens=6",
    "rollout.max_answer_tokens=6",
    "train.prompts_per_step=2",
    "train.micro_batch_prompts=1",
    "algorithm.kl_beta=0",
    "optim.learning_rate=1e-3",
    "deepspeed.zero_stage=0",
    "logging.progress_bar=false",
    "logging.tensorboard=false",
    "seed=0",
    "rewards.weights={fault_length: 1.0}",
)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python tests/faults/fault_cli.py ARGS`` (the vlm-grpoma CLI with the suite's fault hooks) in a fresh
    process with no inherited rendezvous variables."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "FAULT")
    }
    return subprocess.run(
        [sys.executable, str(FAULT_CLI), *args],
        env={**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch(config: Path, *overrides: str, env: dict[str, str] | None = None, timeout: int = 300):
    """``launch/train.sh`` with 2 CPU ranks, each rank running the CLI through ``fault_cli.py``."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "FAULT")
    }
    full_env = {
        **inherited,
        "CPU_RANKS": "2",
        "OMP_NUM_THREADS": "1",
        "TRAIN_SCRIPT": str(FAULT_CLI),
        "PYTHONPATH": PYTHONPATH,
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), *overrides],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_lines(stderr: str) -> list[str]:
    """The CLI's error lines in ``stderr`` (everything else there is library chatter)."""
    return [line for line in stderr.splitlines() if line.startswith("vlm-grpoma ") and ": error: " in line]


def model_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))
