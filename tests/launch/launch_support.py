"""Launch-test helpers: a launcher environment, several launchers run at once, what each rank reported."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TRAIN_SH = REPO / "launch" / "train.sh"
NODE_WORKER = Path(__file__).with_name("node_worker.py")
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
