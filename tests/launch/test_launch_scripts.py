"""The launchers ship in the package: `vlm-grpoma launch-scripts` writes the same files as the checkout's
launch/, and train.sh refuses unusable input with one line before starting the launcher."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from launch_support import REPO, TRAIN_SH, launcher_env

from vlm_grpoma import cli
from vlm_grpoma.launch_scripts import SCRIPTS


def test_launch_scripts_writes_the_checkout_launchers_and_never_overwrites_silently(tmp_path, capsys):
    out = tmp_path / "launch"
    assert cli.main(["launch-scripts", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(SCRIPTS)
    for name in SCRIPTS:
        assert (out / name).read_bytes() == (REPO / "launch" / name).read_bytes(), name
    assert os.access(out / "train.sh", os.X_OK) and not os.access(out / "hostfile.example", os.X_OK)

    (out / "slurm.sbatch").write_text("#SBATCH --partition=mine\n")  # a user's edits
    capsys.readouterr()
    assert cli.main(["launch-scripts", "--out", str(out)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("vlm-grpoma launch-scripts: error:") and "--force" in error
    assert (out / "slurm.sbatch").read_text() == "#SBATCH --partition=mine\n"
    assert cli.main(["launch-scripts", "--out", str(out), "--force"]) == 0
    assert (out / "slurm.sbatch").read_bytes() == (REPO / "launch" / "slurm.sbatch").read_bytes()


def train_sh(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(TRAIN_SH), *args], env=launcher_env(**env), cwd=tmp_path, capture_output=True, text=True
    )


def test_train_sh_refuses_a_missing_config_or_hostfile_in_one_line(tmp_path):
    missing = train_sh(tmp_path, "nope.yaml")
    assert missing.returncode == 2 and missing.stderr == "train.sh: config file nope.yaml not found\n"

    config = tmp_path / "run.yaml"
    config.write_text("train: {steps: 1}\n")
    no_hostfile = train_sh(tmp_path, str(config), HOSTFILE="hostfile", NODE_RANK="0")
    assert no_hostfile.returncode == 2
    assert no_hostfile.stderr.startswith("train.sh: HOSTFILE hostfile not found")

    (tmp_path / "hostfile").write_text("# nothing listed yet\n\n")
    empty = train_sh(tmp_path, str(config), HOSTFILE="hostfile", NODE_RANK="0")
    assert empty.returncode == 2 and empty.stderr == "train.sh: HOSTFILE hostfile lists no host\n"

    no_launcher = train_sh(tmp_path, str(config), DEEPSPEED="no-such-deepspeed")
    assert no_launcher.returncode == 2 and "no-such-deepspeed) is not on PATH" in no_launcher.stderr


def test_train_sh_runs_nothing_hidden_in_a_number_or_an_ssh_override(tmp_path):
    """Before: NUM_GPUS='PATH[$(touch F)]' ran the command (bash evaluates [[ -eq ]] operands as expressions),
    and over ssh an override such as 'seed=1;touch F' reached the remote shell as text."""
    config = tmp_path / "run.yaml"
    config.write_text("train: {steps: 1}\n")
    planted = tmp_path / "planted"
    for name in ("NUM_GPUS", "CPU_RANKS", "NODE_RANK", "MASTER_PORT", "ROLLOUT_PORT"):
        done = train_sh(tmp_path, str(config), **{name: f"PATH[$(touch {planted})]"})
        assert done.returncode == 2 and done.stderr.startswith(f"train.sh: {name} must be a whole number")
    assert not planted.exists()
    (tmp_path / "hostfile").write_text("node-a slots=1\n")
    for override in (f"seed=1;touch {planted}", "seed=$(id)", "seed=`id`", 'a="b"', "seed=1\nid"):
        done = train_sh(tmp_path, str(config), override, HOSTFILE="hostfile")
        assert done.returncode == 2 and "holds a shell character" in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1
    assert not planted.exists()


def test_train_sh_help_is_its_header():
    shown = subprocess.run(["bash", str(TRAIN_SH), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stderr == ""  # asked for: usage on stdout, success
    assert shown.stdout.startswith("Train under the DeepSpeed launcher")
    assert "set -euo" not in shown.stdout and shown.stdout.rstrip().endswith("hostfile.example into DIR.")
    bare = subprocess.run(["bash", str(TRAIN_SH)], capture_output=True, text=True)
    assert bare.returncode == 2 and bare.stdout == "" and bare.stderr == shown.stdout  # no config: misuse


def test_train_sh_serve_and_train_layout_refuses_what_it_cannot_lay_out_in_one_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train: {steps: 1}\n")
    word = train_sh(tmp_path, str(config), ROLLOUT_SERVERS="two")
    assert (
        word.returncode == 2
        and word.stderr == "train.sh: ROLLOUT_SERVERS must be a whole number, got 'two'\n"
    )
    (tmp_path / "hostfile").write_text("node-a slots=1\n")
    nodes = train_sh(tmp_path, str(config), ROLLOUT_SERVERS="1", HOSTFILE="hostfile")
    assert nodes.returncode == 2 and "ROLLOUT_NODES" in nodes.stderr and nodes.stderr.count("\n") == 1
    gpus = train_sh(tmp_path, str(config), ROLLOUT_SERVERS="1", NUM_GPUS="1")
    assert gpus.returncode == 2
    assert gpus.stderr == "train.sh: ROLLOUT_SERVERS=1 leaves none of this node's 1 GPU(s) to train on\n"


def test_train_sh_names_a_rollout_server_that_exits_before_serving_and_starts_no_rank(tmp_path):
    """The server gets the run's config: a model folder that does not exist ends it at start-up, and its last
    line (naming the folder) is the script's one line, before the launcher runs."""
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{name_or_path: {tmp_path / 'no-model'}}}\ntrain: {{steps: 1}}\n")
    run = train_sh(tmp_path, str(config), ROLLOUT_SERVERS="1", ROLLOUT_LOG_DIR="logs")
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert re.match(
        r"train\.sh: rollout server process \d+ exited before serving \(logs/server-0\.log\): ", lines[0]
    )
    assert "vlm-grpoma rollout-server: error:" in lines[0] and "no-model" in lines[0]
    assert (tmp_path / "logs" / "server-0.log").read_text().strip()
