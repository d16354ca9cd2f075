"""Two nodes, each one ``launch/train.sh`` on the hostfile path with ``NODE_RANK`` (no ssh), CPU ranks only.

Two topologies on this one machine: both nodes on loopback (``localhost`` and ``127.0.0.1``), and two network
namespaces joined by a veth pair, each with its own address (skipped where namespaces cannot be made). Each
node trains the real GRPO-MA trainer with ZeRO-2, checkpointing into a shared output folder. Then rank 0's
checkpoint is resumed on a single node: refused with one line at world size 1, resumed exactly at world size 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch_support import NODE_WORKER, TRAIN_SH, explain, launcher_env, rank_reports, run_together

from vlm_grpoma.config import load_config
from vlm_grpoma.distributed import free_port

TIMEOUT_S = 300
STEPS = 3


def start_nodes(config: Path, tmp_path: Path, hosts: list[str], node_env: list[dict[str, str]], prefix=None):
    """One train.sh per host with NODE_RANK = its line in the hostfile; returns the run folder."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes, one CPU rank each\n" + "".join(f"{h} slots=1\n" for h in hosts))
    run, checks = tmp_path / "run", tmp_path / "ranks"
    port = str(free_port())
    commands = []
    for node, extra in enumerate(node_env):
        env = launcher_env(
            HOSTFILE=str(hostfile),
            NODE_RANK=str(node),
            MASTER_PORT=port,
            TRAIN_SCRIPT=str(NODE_WORKER),
            NODE_CHECK_DIR=str(checks),
            **extra,
        )
        argv = ["bash", str(TRAIN_SH), str(config), f"logging.output_dir={run}"]
        commands.append(((prefix(node) if prefix else []) + argv, env))
    results = run_together(commands, tmp_path, TIMEOUT_S)
    assert all(r.returncode == 0 for r in results), explain(results)
    return run, checks, results


def check_two_node_run(config: Path, run: Path, checks: Path, master_addr: str) -> list[dict]:
    """Both ranks saw one world of 2 across two nodes and ended with the same trained parameters."""
    (seen0, params0), (seen1, params1) = rank_reports(checks, 2)
    for node, seen in enumerate((seen0, seen1)):
        assert seen["rank"] == node and seen["world_size"] == 2 and seen["backend"] == "gloo"
        assert seen["steps"] == STEPS
        assert seen["env"]["CROSS_RANK"] == str(node) and seen["env"]["CROSS_SIZE"] == "2"
        assert seen["env"]["LOCAL_RANK"] == "0" and seen["env"]["MASTER_ADDR"] == master_addr
    assert params0.keys() == params1.keys()
    for name in params0:
        assert torch.equal(params0[name], params1[name]), f"the nodes' ranks differ at {name}"

    final = run / "checkpoints" / f"step-{STEPS:08d}"
    meta = json.loads((final / "checkpoint.json").read_text())
    assert meta["world_size"] == 2 and meta["zero_stage"] == 2
    assert sorted(p.name for p in (final / "rng").iterdir()) == ["rank-00000.pt", "rank-00001.pt"]
    exported = load_model_file(final / "model")
    initial = load_model_file(Path(load_config(config).model.name_or_path))
    assert exported.keys() == params0.keys()
    for name, value in exported.items():
        assert torch.equal(value, params0[name]), f"rank 0's export differs from its parameters at {name}"
    assert any(not torch.equal(initial[name], exported[name]) for name in exported), "nothing was trained"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    return rows


def load_model_file(folder: Path) -> dict[str, torch.Tensor]:
    """The parameters of a saved Hugging Face model folder, named as the trainer's module names them."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.launcher
def test_two_nodes_on_loopback_train_alike_and_resume_only_at_the_same_world_size(train_config, tmp_path):
    run, checks, _ = start_nodes(train_config, tmp_path, ["localhost", "127.0.0.1"], [{}, {}])
    rows = check_two_node_run(train_config, run, checks, master_addr="localhost")
    step2 = run / "checkpoints" / "step-00000002"

    # One node, one rank, exact resume asked for: refused up front with one line (ZeRO-2 optimizer partitions,
    # per-rank RNG streams and data shards belong to a world of 2; the elastic path is tests/trainer/
    # test_elastic_resume.py's).
    alone = subprocess.run(
        [Path(sys.executable).parent / "vlm-grpoma", "train", "--config", str(train_config)]
        + [
            f"checkpoint.resume={step2}",
            "checkpoint.elastic_resume=false",
            f"logging.output_dir={tmp_path / 'alone'}",
            "rewards.weights={format: 1.0}",
        ],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert alone.returncode == 1, alone.stdout[-2000:] + alone.stderr[-2000:]
    error = alone.stderr.strip().splitlines()[-1]
    assert error.startswith("vlm-grpoma train: error: ") and "saved with 2 ranks and ZeRO stage" in error
    assert (
        "checkpoint.elastic_resume=false asks for an exact resume" in error
        and "Traceback" not in alone.stderr
    )

    # One node, two CPU ranks (the hostfile's slots): an exact resume, bit-identical to the two-node step 3.
    single = tmp_path / "single-node"
    single.mkdir()
    (single / "hostfile").write_text("localhost slots=2\n")
    resumed = subprocess.run(
        ["bash", str(TRAIN_SH), str(train_config)]
        + [f"checkpoint.resume={step2}", f"logging.output_dir={single / 'run'}"],
        env=launcher_env(
            HOSTFILE=str(single / "hostfile"),
            NODE_RANK="0",
            MASTER_PORT=str(free_port()),
            TRAIN_SCRIPT=str(NODE_WORKER),
            NODE_CHECK_DIR=str(single / "ranks"),
        ),
        cwd=single,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = single / "run" / "checkpoints" / f"step-{STEPS:08d}"
    assert json.loads((after / "checkpoint.json").read_text())["world_size"] == 2
    two_node = rank_reports(checks, 2)[0][1]
    for seen, params in rank_reports(single / "ranks", 2):
        assert seen["world_size"] == 2 and seen["env"]["CROSS_SIZE"] == "1" and seen["steps"] == STEPS
        for name, value in two_node.items():
            assert torch.equal(value, params[name]), f"rank {seen['rank']} resumed to other weights at {name}"
    [row] = [json.loads(line) for line in (single / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == STEPS and row["reward/total_mean"] == rows[-1]["reward/total_mean"]


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: 10.231.0.1 and 10.231.0.2 with their interface names."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2) to make network namespaces")
    tag = f"vg{os.getpid()}"
    names, links = [f"{tag}n0", f"{tag}n1"], [f"{tag}a", f"{tag}b"]
    steps = [
        ["ip", "netns", "add", names[0]],
        ["ip", "netns", "add", names[1]],
        ["ip", "link", "add", links[0], "netns", names[0], "type", "veth", "peer", "name", links[1]]
        + ["netns", names[1]],
    ]
    for i in range(2):
        steps += [
            ["ip", "-n", names[i], "addr", "add", f"10.231.0.{i + 1}/24", "dev", links[i]],
            ["ip", "-n", names[i], "link", "set", links[i], "up"],
            ["ip", "-n", names[i], "link", "set", "lo", "up"],
            ["ip", "netns", "exec", names[i], "true"],
        ]
    try:
        for step in steps:
            made = subprocess.run(step, capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"cannot make network namespaces here: `{' '.join(step)}`: {made.stderr.strip()}")
        yield names, links
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.slow
@pytest.mark.launcher
def test_two_nodes_in_separate_network_namespaces(train_config, tmp_path, two_hosts):
    names, links = two_hosts
    run, checks, _ = start_nodes(
        train_config,
        tmp_path,
        ["10.231.0.1", "10.231.0.2"],
        [{"GLOO_SOCKET_IFNAME": links[0]}, {"GLOO_SOCKET_IFNAME": links[1]}],
        prefix=lambda node: ["ip", "netns", "exec", names[node]],
    )
    check_two_node_run(train_config, run, checks, master_addr="10.231.0.1")
    (seen0, _), (seen1, _) = rank_reports(checks, 2)
    assert seen0["netns"] != seen1["netns"]  # the two ranks really lived on two network stacks
