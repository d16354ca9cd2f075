"""The output folder: the resolved config saved, one job at a time, no other run's results mixed in, and each
step's metrics once after a resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fault_runs import PYTHONPATH, error_lines, run_cli

from vlm_grpoma.errors import ConfigError, StorageError
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.run_dir import LOCK_FILE, OutputLock


def test_the_resolved_config_is_saved_in_the_output_folder(make_config, tmp_path):
    config = make_config(tmp_path / "run", "train.steps=1")
    GRPOMATrainer(config)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved == config.to_dict()
    assert saved["train"]["dist_timeout_s"] == 600.0  # defaults included: the run can be reproduced from it
    assert not list((tmp_path / "run").glob(".config.yaml.*"))  # written through a renamed temporary file


def test_a_second_concurrent_job_on_the_same_folder_is_refused(overrides, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(  # another job: holds the folder's lock like a running trainer
        [
            sys.executable,
            "-c",
            "import sys, time; from vlm_grpoma.trainer.run_dir import OutputLock; "
            "lock = OutputLock(sys.argv[1]); print('locked', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        config = tmp_path / "run.yaml"
        config.write_text("{}\n")
        result = run_cli("train", "--config", str(config), *overrides(out, "train.steps=1"))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result.stderr)
    assert line.startswith(
        f"vlm-grpoma train: error: logging.output_dir: {out} is in use by another job (pid "
    )
    assert line.endswith("wait for it to end, or choose another logging.output_dir")
    assert not (out / "config.yaml").exists()  # the refused job wrote nothing there
    assert (out / LOCK_FILE).is_file()
    OutputLock(out).release()  # killed, the holder's lock is gone with it: no stale lock to remove


def test_a_new_run_refuses_another_runs_folder_unless_it_resumes(make_config, tmp_path):
    out = tmp_path / "run"
    GRPOMATrainer(make_config(out, "train.steps=1")).train()
    with pytest.raises(StorageError) as caught:
        GRPOMATrainer(make_config(out, "train.steps=2"))
    assert str(caught.value) == (
        f"logging.output_dir: {out} already holds a run (metrics.jsonl with 1 row(s), checkpoints/step-00000001); "
        "continue it with checkpoint.resume=auto, or choose a new logging.output_dir"
    )
    resumed = GRPOMATrainer(make_config(out, "train.steps=2", "checkpoint.resume=auto"))
    assert resumed.step == 1
    resumed.train()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_metrics_of_redone_steps_appear_once_after_a_resume(make_config, tmp_path):
    """A crash after step 4 was logged but before its checkpoint: the resume redoes steps 3 and 4."""
    out = tmp_path / "run"
    GRPOMATrainer(
        make_config(out, "train.steps=4", "checkpoint.save_every=2", "logging.tensorboard=true")
    ).train()
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    before = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resumed = GRPOMATrainer(
        make_config(out, "train.steps=4", "checkpoint.resume=auto", "logging.tensorboard=true")
    )
    assert resumed.step == 2
    resumed.train()
    after = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in after] == [1, 2, 3, 4]
    assert after[:2] == before[:2]  # the steps before the checkpoint are kept as they were
    assert after[2]["reward/total_mean"] == pytest.approx(before[2]["reward/total_mean"], abs=0)  # exact redo

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/total_mean")] == [1, 2, 3, 4]


@pytest.mark.parametrize("value", ["''", "'  '"])
def test_an_empty_output_dir_is_a_config_error(make_config, tmp_path, value):
    with pytest.raises(ConfigError, match=r"^logging\.output_dir: is empty"):
        make_config(tmp_path, f"logging.output_dir={value}")


@pytest.mark.parametrize("where", ["a file", "under a file", "/dev/null"])
def test_an_output_dir_that_cannot_be_a_folder_is_one_line(where, make_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = {"a file": blocker, "under a file": blocker / "run", "/dev/null": Path("/dev/null")}[where]
    with pytest.raises(StorageError) as refused:
        GRPOMATrainer(make_config(out))
    message = str(refused.value)
    assert message.startswith("logging.output_dir: ") and "\n" not in message, message
    assert "not a folder" in message or "is a file, not a folder" in message, message
