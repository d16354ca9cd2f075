"""``launch/slurm.sbatch`` as Slurm runs it, with stand-in ``scontrol`` and ``srun`` executables on PATH.

The stand-in ``srun`` starts the job step once per node of the allocation, here, with that node's Slurm
variables (``SLURM_NODEID``…) and records its arguments and environment; ``scontrol show hostnames`` splits
the node list at commas. What is checked is the script's side: the hostfile it writes, the node ranks and
rendezvous it hands each node's ``train.sh``, the environment srun gets, and that the two nodes then train as
one world of 2 (the real GRPO-MA trainer under the real DeepSpeed launcher, CPU ranks).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch
from launch_support import NODE_WORKER, explain, launcher_env, rank_reports, run_together

from tests.rollout.server_process import TEST_ENGINE
from vlm_grpoma.distributed import free_port
from vlm_grpoma.launch_scripts import write_launch_scripts

SRUN = r"""#!/usr/bin/env bash
# Stand-in srun: one task per node of the allocation, all run on this machine with that node's variables.
# --nodelist=a,b: those nodes only (a step on part of the allocation, its logs named after its first node).
printf '%s\n' "$@" > "$SRUN_RECORD/args"
env | grep -E '^(SRUN|SLURM)_' | sort > "$SRUN_RECORD/env"
nodelist=$SLURM_JOB_NODELIST
prefix=
while [[ "$1" == --* ]]; do
    [[ "$1" == --nodelist=* ]] && { nodelist=${1#--nodelist=}; prefix=step-${nodelist%%,*}-; }
    shift
done
mapfile -t hosts < <(scontrol show hostnames "$nodelist")
pids=()
trap 'kill -TERM "${pids[@]}" 2> /dev/null; wait; exit 143' TERM  # srun passes a signal on to its tasks
for i in "${!hosts[@]}"; do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURMD_NODENAME=${hosts[$i]} "$@" \
        > "$SRUN_RECORD/${prefix}node-$i.log" 2>&1 &
    pids+=($!)
done
status=0
for _ in "${pids[@]}"; do
    wait -n || { status=$?; kill "${pids[@]}" 2> /dev/null; }  # --kill-on-bad-exit
done
exit $status
"""
SCONTROL = r"""#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] || { echo "scontrol stand-in: only 'show hostnames'" >&2; exit 1; }
tr ',' '\n' <<< "$3"
"""
JOB_ID = "4242"
STEPS = 2


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Path]:
    """A submit folder holding launch/ (as `vlm-grpoma launch-scripts` writes it), the stand-ins, and the
    spooled copy of the batch script that sbatch would run."""
    submit = tmp_path / "submit"
    write_launch_scripts(submit / "launch")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copyfile(submit / "launch" / "slurm.sbatch", spool / "slurm_script")
    record = tmp_path / "srun-record"
    record.mkdir()
    return {"submit": submit, "tools": tools, "script": spool / "slurm_script", "record": record}


def job_env(cluster: dict[str, Path], **extra: str) -> dict[str, str]:
    """What Slurm exports to the batch script of a 2-node allocation (plus the stand-ins on PATH)."""
    slurm = {
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NAME": "vlm-grpoma",
        "SLURM_JOB_NODELIST": "localhost,127.0.0.1",
        "SLURM_NNODES": "2",
        "SLURM_SUBMIT_DIR": str(cluster["submit"]),
        "SLURM_CPUS_PER_TASK": "1",
        "SRUN_RECORD": str(cluster["record"]),
    }
    env = launcher_env(**{**slurm, **extra})
    env["PATH"] = f"{cluster['tools']}:{env['PATH']}"
    return env


@pytest.mark.slow
@pytest.mark.launcher
def test_slurm_batch_script_runs_one_launcher_per_node(train_config, tmp_path, cluster):
    port = str(free_port())
    env = job_env(
        cluster,
        GPUS_PER_NODE="1",  # CPU-only nodes: one CPU rank each
        MASTER_PORT=port,
        TRAIN_SCRIPT=str(NODE_WORKER),
        NODE_CHECK_DIR=str(tmp_path / "ranks"),
    )
    argv = ["bash", str(cluster["script"]), str(train_config), f"logging.output_dir={tmp_path / 'run'}"]
    [job] = run_together([([*argv, f"train.steps={STEPS}"], env)], tmp_path, timeout=300)
    nodes = [(cluster["record"] / f"node-{i}.log") for i in range(2)]
    logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in nodes if p.is_file())
    assert job.returncode == 0, explain([job]) + logs
    assert f"job {JOB_ID}, 2 nodes x 1 ranks, rendezvous localhost:{port}" in job.output

    submit = cluster["submit"]
    assert (submit / "runs" / f"hostfile-{JOB_ID}").read_text() == "localhost slots=1\n127.0.0.1 slots=1\n"
    srun_args = (cluster["record"] / "args").read_text().splitlines()
    assert srun_args[:2] == ["--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    assert "SRUN_CPUS_PER_TASK=1" in (cluster["record"] / "env").read_text().splitlines()

    reports = rank_reports(tmp_path / "ranks", 2)
    for node, (seen, _) in enumerate(reports):
        assert seen["rank"] == node and seen["world_size"] == 2 and seen["steps"] == STEPS
        assert seen["env"]["NODE_RANK"] == str(node) and seen["env"]["CROSS_RANK"] == str(node)
        assert seen["env"]["MASTER_ADDR"] == "localhost" and seen["env"]["MASTER_PORT"] == port
        assert seen["env"]["HOSTFILE"] == f"runs/hostfile-{JOB_ID}"
    (_, params0), (_, params1) = reports
    assert all(torch.equal(params0[name], params1[name]) for name in params0)
    assert (tmp_path / "run" / "checkpoints" / f"step-{STEPS:08d}" / "checkpoint.json").is_file()


def test_slurm_batch_script_refuses_clearly_before_starting_anything(tmp_path, cluster):
    # Slurm opens the job log before the script runs: it must not point into a folder that may not exist.
    [output] = re.findall(r"^#SBATCH --output=(\S+)$", cluster["script"].read_text(), re.MULTILINE)
    assert "/" not in output

    config = tmp_path / "run.yaml"
    config.write_text("train: {steps: 1}\n")
    script = ["bash", str(cluster["script"]), str(config)]
    [no_count] = run_together([(script, job_env(cluster))], tmp_path, timeout=30)
    assert no_count.returncode == 2 and "set GPUS_PER_NODE" in no_count.output

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    [no_launch] = run_together(
        [(script, job_env(cluster, SLURM_SUBMIT_DIR=str(elsewhere), GPUS_PER_NODE="1"))], tmp_path, timeout=30
    )
    assert no_launch.returncode == 2 and f"no launch/train.sh in {elsewhere}" in no_launch.output
    assert not (cluster["record"] / "args").exists()  # srun never ran


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.launcher
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed in this environment (`make test-vllm` runs these tests in .venv-vllm)",
)
def test_slurm_batch_script_serves_from_its_first_node_and_trains_on_the_other(
    train_config, tiny_model_dir, tmp_path, cluster
):
    """ROLLOUT_NODES=1: node 0 runs a rollout server (train.sh in serve-only mode), node 1 trains two CPU ranks
    through it (async), the hostfile lists the training node only, and the server ends with the job."""
    port, server_port = str(free_port()), free_port()
    env = job_env(
        cluster,
        GPUS_PER_NODE="2",  # the training node's CPU ranks
        ROLLOUT_NODES="1",
        ROLLOUT_SERVERS_PER_NODE="1",
        ROLLOUT_PORT=str(server_port),
        MASTER_PORT=port,
        TRAIN_SCRIPT=str(NODE_WORKER),
        NODE_CHECK_DIR=str(tmp_path / "ranks"),
    )
    model = tiny_model_dir("qwen2_5_vl", "small")
    argv = [
        "bash",
        str(cluster["script"]),
        str(train_config),
        f"logging.output_dir={tmp_path / 'run'}",
        f"model.name_or_path={model}",
        "model.max_pixels=12544",
        "train.prompts_per_step=4",
        "train.async_rollout.enabled=true",
        *TEST_ENGINE[1:],
    ]
    [job] = run_together([(argv, env)], tmp_path, timeout=900)
    logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in cluster["record"].glob("*.log"))
    assert job.returncode == 0, explain([job]) + logs
    submit = cluster["submit"]
    assert (submit / "runs" / f"hostfile-{JOB_ID}").read_text() == "127.0.0.1 slots=2\n"
    assert f"1 rollout server(s) on localhost; logs in runs/rollout-servers-{JOB_ID}" in job.output
    server_log = submit / "runs" / f"rollout-servers-{JOB_ID}" / "localhost" / "server-0.log"
    assert f"listening on http://0.0.0.0:{server_port}" in server_log.read_text()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"http://localhost:{server_port}" in saved and "vllm_server" in saved
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    reports = rank_reports(tmp_path / "ranks", 2)
    assert all(seen["world_size"] == 2 and seen["env"]["NODE_RANK"] == "0" for seen, _ in reports)
    with pytest.raises(OSError):  # stopped with the job
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{server_port}/health", timeout=5
        )
