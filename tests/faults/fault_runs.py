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


def fresh_environment() -> dict[str, str]:
    """This process's environment without rendezvous variables or a fault switch: a new job's."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "FAULT")
    }


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python tests/faults/fault_cli.py ARGS`` (the vlm-grpoma CLI with the suite's fault hooks) in a fresh
    process with no inherited rendezvous variables."""
    inherited = fresh_environment()
    return subprocess.run(
        [sys.executable, str(FAULT_CLI), *args],
        env={**inherited, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch(config: Path, *overrides: str, env: dict[str, str] | None = None, timeout: int = 300):
    """``launch/train.sh`` with 2 CPU ranks, each rank running the CLI through ``fault_cli.py``."""
    inherited = fresh_environment()
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


def two_ranks(
    command: str, config: Path, args: list[str], env: dict[str, str]
) -> list[subprocess.CompletedProcess]:
    """The two ranks of a one-node CPU job started as DeepSpeed's launcher starts them (rendezvous variables),
    without the launcher, which kills the other ranks as soon as one exits non-zero: each rank's own exit code
    and output."""
    from vlm_grpoma.distributed import free_port

    common = {
        **fresh_environment(),
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "LOCAL_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": PYTHONPATH,
        **env,
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-u", str(FAULT_CLI), command, "--config", str(config), *args],
            env={**common, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        return [
            subprocess.CompletedProcess(job.args, job.wait(timeout=300), *job.communicate(timeout=300))
            for job in ranks
        ]
    finally:
        for job in ranks:
            job.kill()
