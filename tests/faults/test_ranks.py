"""A hung rank ends the job after ``train.dist_timeout_s`` with one line naming the collective that waited,
instead of hanging for DeepSpeed's default 30 minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fault_runs import error_lines, launch


@pytest.mark.slow
@pytest.mark.launcher
def test_a_hung_rank_ends_the_job_naming_the_collective(overrides, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    args = overrides(
        tmp_path / "run", "train.steps=2", "train.dist_timeout_s=5", "rewards.weights={fault_sleepy: 1.0}"
    )
    # Rank 1 sleeps 20 s, four times the timeout: rank 0's line proves the timeout fired (without it, rank 0
    # would wait and the run would succeed). Longer would only add to the 30 s DeepSpeed's launcher gives a
    # rank it has SIGTERMed before it kills it.
    start = time.perf_counter()
    run = launch(config, *args, env={"SLEEP_RANK": "1", "SLEEP_S": "20"}, timeout=240)
    wall = time.perf_counter() - start
    assert run.returncode != 0
    lines = error_lines(run.stderr)
    assert lines == [
        "vlm-grpoma train: error: step 1: rank 0: no answer from the other ranks within train.dist_timeout_s=5 s "
        "in the gradient all-reduce of the optimizer step: a rank hung or died; its own output says why",
        # rank 1, awake again, finds rank 0 gone: one line of its own, no traceback
        "vlm-grpoma train: error: step 1: rank 1: no answer from the other ranks within train.dist_timeout_s=5 s "
        "in the gradient all-reduce of the optimizer step: a rank died; its own output says why",
    ], run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert wall < 60, wall  # start-up and the sleeping rank's 20 s, not DeepSpeed's default 30 min


def test_only_backend_peer_failures_become_distributed_errors():
    from vlm_grpoma.distributed import init_distributed
    from vlm_grpoma.errors import DistributedError
    from vlm_grpoma.trainer.collectives import collective

    init_distributed("gloo")
    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv"
    )
    with pytest.raises(DistributedError, match=r"^rank 0: no answer from the other ranks within .* in the x"):
        with collective("the x", 5):
            raise gloo
    with pytest.raises(RuntimeError, match="simulator worker timed out"):  # a reward's own timeout passes
        with collective("the x", 5):
            raise RuntimeError("simulator worker timed out")


SHM_PROBE = """
import json, os
import vlm_grpoma.distributed as d
removed = []
real = d.release_shm_buffer
d.release_shm_buffer = lambda: removed.append(real()) or removed[-1]
d.init_distributed("gloo")
path = removed[0]
print(json.dumps({"removed": str(path), "port": os.environ["MASTER_PORT"], "left": path is not None and path.exists()}))
"""


def test_deepspeeds_shared_memory_segment_is_unlinked_once_mapped():
    """DeepSpeed's CPU op creates a ~69 MB /dev/shm segment per rank and never unlinks it: init_distributed
    does, so no run (finished or killed) leaves one behind."""
    env = {**os.environ, "LOCAL_SIZE": "1", "PYTHONWARNINGS": "ignore"}  # a lone local rank: the op makes one
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    run = subprocess.run(
        [sys.executable, "-c", SHM_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert (
        result["removed"] == f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{result['port']}_0"
    )
    assert result["left"] is False
