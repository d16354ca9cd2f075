"""Ctrl-C, SIGTERM and SIGUSR1 (Slurm's time-limit warning) finish the current step, save a checkpoint, name it
and exit with code 75; the same command with ``checkpoint.resume=auto`` continues from it and says so; the
Slurm batch script asks for the signal, requeues the stopped job and resumes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_runs import FAULT_CLI, PYTHONPATH, REPO, fresh_environment, launch, run_cli, two_ranks

from vlm_grpoma.launch_scripts import write_launch_scripts
from vlm_grpoma.trainer.checkpoint import list_checkpoints
from vlm_grpoma.trainer.stop_signals import STOPPED_EXIT_CODE

STEPS = 4
SIGNALLED = ("rewards.weights={fault_signal: 1.0}",)


def _train(overrides, out: Path, *extra: str, env: dict[str, str] | None = None):
    config = out.parent / f"{out.name}.yaml"
    config.write_text("{}\n")
    return run_cli(
        "train", "--config", str(config), *overrides(out, f"train.steps={STEPS}", *SIGNALLED, *extra), env=env
    )


def _rows(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_saves_that_step_names_it_and_resume_continues(sig, overrides, tmp_path):
    out = tmp_path / "run"
    stopped = _train(overrides, out, env={"SIGNAL": sig, "SIGNAL_AT_CALL": "2"})  # during step 2
    assert stopped.returncode == STOPPED_EXIT_CODE, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    checkpoint = out / "checkpoints" / "step-00000002"
    assert f"stopped by {sig} after step 2 of {STEPS}: checkpoint {checkpoint};" in stopped.stdout, (
        stopped.stdout
    )
    assert list_checkpoints(out) == [checkpoint] and _rows(out) == [1, 2]

    resumed = _train(overrides, out, "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoint} (step 2 of {STEPS})" in resumed.stdout
    assert _rows(out) == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.launcher
def test_sigterm_on_one_rank_of_two_stops_both_after_the_step_with_one_checkpoint(overrides, tmp_path):
    """A scheduler that preempts one task of a job: rank 1 alone gets SIGTERM mid-step 2; the ranks agree
    after the step, both save step 2 (one checkpoint) and exit 75, and the job resumes from it."""
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    args = overrides(out, f"train.steps={STEPS}", *SIGNALLED)
    ranks = two_ranks("train", config, args, {"SIGNAL": "SIGTERM", "SIGNAL_AT_CALL": "2", "SIGNAL_RANK": "1"})
    said = "".join(rank.stdout + rank.stderr for rank in ranks)
    assert [rank.returncode for rank in ranks] == [STOPPED_EXIT_CODE] * 2, said[-3000:]
    assert "Traceback" not in said
    checkpoint = out / "checkpoints" / "step-00000002"
    assert "SIGTERM: finishing the current step" in ranks[1].stderr and "SIGTERM" not in ranks[0].stderr
    assert f"stopped by a signal to another rank after step 2 of {STEPS}: checkpoint {checkpoint};" in (
        ranks[0].stdout
    )
    assert list_checkpoints(out) == [checkpoint] and _rows(out) == [1, 2]

    resumed = launch(config, *args, "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _rows(out) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_running_job_signalled_from_outside_stops_after_its_step(overrides, tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    job = subprocess.Popen(
        [
            sys.executable,
            str(FAULT_CLI),
            "train",
            "--config",
            str(config),
            *overrides(out, "train.steps=200"),
        ],
        env={**fresh_environment(), "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").is_file() or not _rows(out):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.2)
        job.send_signal(signal.SIGUSR1)
        stdout, stderr = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode == STOPPED_EXIT_CODE, stderr[-3000:]
    (saved,) = list_checkpoints(out)
    step = int(saved.name.split("-")[1])
    assert 1 <= step < 200 and _rows(out) == list(range(1, step + 1))
    assert f"stopped by SIGUSR1 after step {step} of 200: checkpoint {saved};" in stdout


SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECORD/srun-args"
exit "${SRUN_STATUS:-0}"
"""
SCONTROL = """#!/usr/bin/env bash
if [[ "$1 $2" == "show hostnames" ]]; then tr ',' '\\n' <<< "$3"; exit 0; fi
printf '%s\\n' "$*" >> "$RECORD/scontrol"
"""


def _sbatch(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``launch/slurm.sbatch`` with stand-in ``srun`` (exits SRUN_STATUS) and ``scontrol`` (records calls)."""
    submit, tools = tmp_path / "submit", tmp_path / "bin"
    if not submit.is_dir():
        write_launch_scripts(submit / "launch")
    tools.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    slurm = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "1",
        "SLURM_SUBMIT_DIR": str(submit),
        "GPUS_PER_NODE": "1",
        "RECORD": str(tmp_path),
    }
    return subprocess.run(
        ["bash", str(submit / "launch" / "slurm.sbatch"), "run.yaml", "train.steps=9"],
        env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", **slurm, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_slurm_script_asks_for_the_signal_requeues_a_stopped_job_and_resumes_it(tmp_path):
    script = (REPO / "launch" / "slurm.sbatch").read_text()
    assert "#SBATCH --signal=USR1@" in script and "#SBATCH --requeue" in script
    stopped = _sbatch(tmp_path, SRUN_STATUS=str(STOPPED_EXIT_CODE))
    assert stopped.returncode == 0, stopped.stderr
    assert (tmp_path / "scontrol").read_text().splitlines() == ["requeue 77"]
    assert (tmp_path / "srun-args").read_text().splitlines()[
        -1
    ] == "train.steps=9"  # a first start: no resume

    requeued = _sbatch(tmp_path, SLURM_RESTART_COUNT="1")
    assert requeued.returncode == 0, requeued.stderr
    assert (tmp_path / "srun-args").read_text().splitlines()[-2:] == [
        "train.steps=9",
        "checkpoint.resume=auto",
    ]
    failed = _sbatch(tmp_path, SRUN_STATUS="1")
    assert failed.returncode == 1 and (tmp_path / "scontrol").read_text().splitlines() == ["requeue 77"]
