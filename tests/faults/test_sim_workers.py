"""A SAPIEN worker that dies or freezes while ``manip-eval`` samples episodes: replaced, the episode sampled
again, the same episodes as an undisturbed run; one that always dies is one line naming the episode."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fault_runs import error_lines, run_cli

from vlm_grpoma.envs.sapien import pool as pool_module
from vlm_grpoma.envs.sapien.pool import SimPool
from vlm_grpoma.envs.sapien.task import sample_split_episode
from vlm_grpoma.errors import CommandError
from vlm_grpoma.eval.manipulation import SAMPLE_RETRIES, sample_split

VICTIM = 3  # the episode whose sampling job misbehaves


def faulty_sampler(marker_dir: Path, fault: str, times: int):
    """``sample`` that, for episode VICTIM, SIGKILLs or freezes its worker on the first ``times`` calls (counted
    in files, as each call runs in a fresh process)."""

    def sample(split: str, index: int, seed: int):
        calls = len(list(marker_dir.glob(f"{split}-{index}-*")))
        if index == VICTIM and calls < times:
            (marker_dir / f"{split}-{index}-{calls}").touch()
            if fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        return sample_split_episode(split, index, seed)

    return sample


@pytest.fixture
def faulty_pool(monkeypatch, tmp_path):
    """``faulty_pool(fault, times, **pool_options)``: a forked pool whose workers run the faulty sampler."""
    pools = []

    def make(fault: str, times: int, **options) -> SimPool:
        monkeypatch.setitem(pool_module.JOBS, "sample", faulty_sampler(tmp_path, fault, times))
        pools.append(SimPool(start_method="fork", **options))  # forked workers inherit the patched job table
        return pools[-1]

    yield make
    for p in pools:
        p.close()


def test_a_worker_killed_while_sampling_is_replaced_and_the_episode_sampled_again(faulty_pool):
    pool = faulty_pool("die", 1, workers=2)
    episodes, dropped = sample_split(pool, "seen", 6, seed=1)
    assert episodes == [sample_split_episode("seen", i, 1) for i in range(6)] and dropped == 0
    assert (pool.crashes, pool.retried) == (1, 1)


def test_a_frozen_sampling_worker_is_killed_at_the_configured_deadline(faulty_pool):
    pool = faulty_pool("freeze", 1, workers=1, job_deadline_s=1.5)
    start = time.monotonic()
    episodes, _ = sample_split(pool, "unseen", 5, seed=2)
    assert time.monotonic() - start < 20  # not the default 70 s deadline
    assert episodes == [sample_split_episode("unseen", i, 2) for i in range(5)]
    assert (pool.crashes, pool.retried) == (1, 1)


def test_a_worker_that_always_dies_is_one_line_naming_the_episode(faulty_pool):
    pool = faulty_pool("die", SAMPLE_RETRIES + 1, workers=2)
    with pytest.raises(CommandError) as caught:
        sample_split(pool, "seen", 5, seed=1)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"could not sample episode {VICTIM} of split 'seen': the simulator worker died")
    assert f"on each of {SAMPLE_RETRIES + 1} attempts" in message
    assert len(pool.worker_pids()) == 2  # the pool is whole again for whoever uses it next


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_a_bad_job_timeout_is_one_line(tmp_path, value):
    proc = run_cli(
        "manip-eval", "--policy", "oracle", "--episodes", "2", "--out", str(tmp_path / "r.json"),
        "--job-timeout", value,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    [line] = error_lines(proc.stderr)
    assert line.endswith(f"error: --job-timeout must be a positive number of seconds, got {float(value)}")
    assert not (tmp_path / "r.json").exists()


def test_manip_eval_uses_the_job_timeout(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli(
        "manip-eval", "--policy", "oracle", "--split", "seen", "--episodes", "3", "--workers", "1",
        "--job-timeout", "30", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert '"successes"' in out.read_text()


def test_a_crash_rendering_the_contact_grid_loses_no_results(tmp_path, monkeypatch, capsys):
    """The grid is an optional picture: the results JSON and table are on disk before it is rendered."""
    from vlm_grpoma import cli
    from vlm_grpoma.eval import manipulation

    def crash(triples, path):
        assert json.loads(out.read_text())["aggregates"]  # already written when the grid starts
        raise RuntimeError("vk::Queue::submit: ErrorDeviceLost")

    out = tmp_path / "r.json"
    monkeypatch.setattr(manipulation, "render_grid", crash)
    command = ["manip-eval", "--policy", "oracle", "--split", "seen", "--episodes", "2", "--workers", "1"]
    assert cli.main([*command, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["aggregates"]["seen"]["episodes"] == 2 and result["grid"] is None
    assert "| **seen** |" in out.with_suffix(".md").read_text()
    assert (
        "(no grid: rendering it failed: RuntimeError: vk::Queue::submit: ErrorDeviceLost)"
        in capsys.readouterr().out
    )


def test_manip_eval_refuses_an_unwritable_out_before_sampling(tmp_path, monkeypatch, capsys):
    from vlm_grpoma import cli
    from vlm_grpoma.eval import manipulation

    monkeypatch.setattr(manipulation, "evaluate", lambda *a, **k: pytest.fail("the evaluation ran"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.json").mkdir()
    cases = {
        tmp_path / "file" / "r.json": f"--out {tmp_path / 'file'}: exists and is not a folder",
        tmp_path
        / "folder.json": f"--out {tmp_path / 'folder.json'}: is a folder; name the results JSON file",
        Path(
            "/sys/fs/vlm-grpoma/r.json"
        ): "--out /sys/fs/vlm-grpoma: cannot write there (",  # read-only sysfs
    }
    for out, message in cases.items():
        assert cli.main(["manip-eval", "--policy", "oracle", "--out", str(out)]) == 1
        [line] = error_lines(capsys.readouterr().err)
        assert line.startswith(f"vlm-grpoma manip-eval: error: {message}"), line


def test_assets_with_only_training_instances_say_so(tmp_path):
    from vlm_grpoma.envs.sapien.partnet_export import generate_assets
    from vlm_grpoma.eval.manipulation import evaluate

    generate_assets(tmp_path, 1, categories=("drawer_cabinet", "refrigerator"))  # one training instance each
    with pytest.raises(CommandError) as caught:
        evaluate("oracle", ("seen",), 2, 0, workers=1, assets=tmp_path)
    assert str(caught.value).startswith(
        f"no seen objects among the 2 object(s) found in --assets {tmp_path} (2 training instances of seen or "
        "train-only categories): seen categories are "
    )
    assert "StorageFurniture" in str(caught.value) and "(manipllm split)" in str(caught.value)
