"""Simulator worker pool: cross-process determinism and crash isolation; Mesa fetch script behaviour."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from vlm_grpoma.envs.sapien.pool import SimPool, WorkerCrash
from vlm_grpoma.envs.sapien.task import ExecConfig, execute, sample_split_episode
from vlm_grpoma.envs.sapien.vulkan import FETCH_SCRIPT, fetch_mesa, rendering_status
from vlm_grpoma.eval.manipulation import random_action


@pytest.fixture(scope="module")
def pool():
    with SimPool(2) as p:
        yield p


def _strip(outcome):
    return replace(outcome, seconds=0.0)


def test_pool_matches_in_process_results(pool):
    sampled = pool.map([("sample", ("seen", i, 1), {}) for i in range(8)])
    # same episodes in other processes
    assert sampled == [sample_split_episode("seen", i, 1) for i in range(8)]
    jobs = [(spec, oracle) for spec, oracle in sampled] + [
        (spec, random_action(spec, 1, i)) for i, (spec, _) in enumerate(sampled)
    ]
    remote = pool.execute(jobs)
    local = [execute(spec, action) for spec, action in jobs]
    assert [_strip(o) for o in remote] == [_strip(o) for o in local]
    assert sum(o.success for o in remote[:8]) >= 7


def test_job_errors_are_returned_not_raised(pool):
    [result] = pool.map([("sample", ("validation", 0, 0), {})])
    assert isinstance(result, RuntimeError) and "unknown split" in str(result)


def test_dead_worker_is_replaced_and_its_episode_fails(pool):
    spec, oracle = sample_split_episode("unseen", 0, 1)
    endless = ExecConfig(move_steps=10**8, max_steps=10**8, timeout_s=120)
    victim = pool.worker_pids()[0]

    def kill_when_busy():
        time.sleep(1.5)
        os.kill(victim, signal.SIGKILL)

    threading.Thread(target=kill_when_busy, daemon=True).start()
    crashes = pool.crashes
    [crashed] = pool.execute([(spec, oracle)], endless)  # the first idle worker (the victim) takes it
    assert (crashed.success, crashed.failure) == (False, "worker_crash")
    assert pool.crashes == crashes + 1 and victim not in pool.worker_pids() and len(pool.worker_pids()) == 2
    after = pool.execute([(spec, oracle)] * 3)
    assert all(o.success for o in after)


def test_hung_worker_is_killed_at_the_deadline():
    spec, oracle = sample_split_episode("seen", 2, 1)
    with SimPool(1, job_deadline_s=2.0) as p:
        [result] = p.map(
            [("execute", (spec, oracle, ExecConfig(move_steps=10**8, max_steps=10**8, timeout_s=600)), {})]
        )
        assert isinstance(result, WorkerCrash) and result.reason == "timeout"
        assert p.execute([(spec, oracle)])[0].success


def test_fetch_mesa_without_apt_warns_and_exits_zero(tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("mkdir", "rm", "cat", "awk", "sed", "find", "head", "touch"):
        os.symlink(shutil.which(tool), tools / tool)
    dest = tmp_path / "mesa"
    proc = subprocess.run(
        ["/bin/bash", str(FETCH_SCRIPT), str(dest)],
        capture_output=True,
        text=True,
        env={"PATH": str(tools)},
    )
    assert proc.returncode == 0 and "WARNING" in proc.stderr
    assert "apt-get/dpkg not found" in (dest / "FAILED").read_text()
    # the reason reaches the rendering status that tests and `vlm-grpoma env` print
    monkeypatch.setenv("VLM_GRPOMA_CACHE", str(tmp_path))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    ok, reason = rendering_status.__wrapped__(True)
    assert not ok and "apt-get/dpkg not found" in reason


def test_fetch_mesa_is_idempotent(tmp_path, capfd):
    dest = tmp_path / "mesa"
    dest.mkdir()
    (dest / ".ok").touch()
    (dest / "lvp_icd.json").write_text("{}")
    assert fetch_mesa(dest) == dest / "lvp_icd.json"
    assert "already fetched" in capfd.readouterr().out


def test_worker_that_died_idle_is_replaced_before_use(pool):
    spec, oracle = sample_split_episode("seen", 4, 1)
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.5)
    crashes = pool.crashes
    outcomes = pool.execute([(spec, oracle)] * 2)
    assert all(o.success for o in outcomes)  # nothing was lost: the job was not sent to the dead worker
    assert victim not in pool.worker_pids() and pool.crashes == crashes + 1
