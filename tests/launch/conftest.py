"""Launch-test helpers: a tiny training config, a launcher environment, and several launchers run at once.

DeepSpeed's JIT-built communication op lives in the project cache (``TORCH_EXTENSIONS_DIR``), so only the
first test run on a machine pays its ~35 s build.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TRAIN_SH = REPO / "launch" / "train.sh"
NODE_WORKER = Path(__file__).with_name("node_worker.py")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
# Rendezvous variables of an in-process group a previous test made; launcher ranks must get their own.
_RANK_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "HOSTFILE")


def launcher_env(**extra: str) -> dict[str, str]:
    """This process's environment for a launcher: no inherited rank variables, CPU ranks (even on a GPU
    machine: these tests are about topology), one thread per rank, the venv's tools on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    env.update(extra)
    return env


@dataclass
class Finished:
    returncode: int
    output: str


def run_together(
    commands: list[tuple[list[str], dict[str, str]]], cwd: Path, timeout: float
) -> list[Finished]:
    """Start every (argv, env) at once, each in its own process group, and wait for all; past ``timeout``
    seconds (all together) kill what still runs (its return code is then -9)."""
    logs, procs = [], []
    deadline = time.monotonic() + timeout
    try:
        for i, (argv, env) in enumerate(commands):
            logs.append((cwd / f"process-{i}.log").open("w+"))
            procs.append(
                subprocess.Popen(
                    argv, env=env, cwd=cwd, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    results = []
    for proc, log in zip(procs, logs):
        log.seek(0)
        results.append(Finished(proc.returncode, log.read()))
        log.close()
    return results


def explain(results: list[Finished]) -> str:
    return "\n".join(
        f"--- process {i} (exit {r.returncode}) ---\n{r.output[-4000:]}" for i, r in enumerate(results)
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


def rank_reports(folder: Path, world: int) -> list[tuple[dict, dict[str, torch.Tensor]]]:
    """What each rank of ``node_worker.py`` wrote: (its view of the job, its parameters)."""
    import json

    from safetensors.torch import load_file

    return [
        (
            json.loads((folder / f"rank-{r}.json").read_text()),
            load_file(str(folder / f"rank-{r}.safetensors")),
        )
        for r in range(world)
    ]
