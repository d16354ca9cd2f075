"""DeepSpeed's JIT-built ops: a lock left by a killed build never stalls a run, each torch version builds into its
own folder, and a first build says what it is doing.

torch >= 2.14.1 (this environment) holds an OS lock that dies with its holder; torch < 2.14 (the CPU vLLM stack,
older GPU images) waits for the lock *file* to disappear, forever. That old wait is reproduced here with torch's
own ``FileBaton``, which still ships with torch.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fault_runs import PYTHONPATH
from torch.utils.file_baton import FileBaton

from vlm_grpoma import distributed
from vlm_grpoma.distributed import before_jit_build, jit_ops_tag, release_stale_jit_lock, torch_extensions_dir

OP = "deepspeed_shm_comm"


def _planted_lock(build_dir: Path, age_s: float) -> Path:
    """An op folder as a build killed midway leaves it: build.ninja and the lock, last touched ``age_s`` ago."""
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "lock"
    for path in (build_dir / "build.ninja", lock):
        path.touch()
    stamp = time.time() - age_s
    for path in (build_dir / "build.ninja", lock, build_dir):
        os.utime(path, (stamp, stamp))
    return lock


def _old_torch_wait_ends(lock: Path, within_s: float) -> bool:
    """Whether torch < 2.14's wait on ``lock`` (``FileBaton.wait``: until the file is gone) ends in time."""
    waiter = threading.Thread(target=FileBaton(str(lock), wait_seconds=0.05).wait, daemon=True)
    waiter.start()
    waiter.join(within_s)
    return not waiter.is_alive()


@pytest.fixture
def old_torch(monkeypatch):
    """This process behaves as torch < 2.14.1 does: it would wait for a lock file to disappear."""
    monkeypatch.setattr(distributed, "_torch_waits_for_lock_file", lambda: True)


def test_a_stale_lock_is_removed_with_a_warning_so_old_torchs_wait_ends(tmp_path, old_torch, caplog):
    lock = _planted_lock(tmp_path / OP, age_s=3600)
    assert not _old_torch_wait_ends(lock, within_s=0.5)  # the hang: the old wait never ends by itself
    with caplog.at_level(logging.WARNING, logger="vlm_grpoma.distributed"):
        release_stale_jit_lock(tmp_path / OP)
    assert not lock.exists()
    assert _old_torch_wait_ends(lock, within_s=5)
    assert [r.getMessage() for r in caplog.records if str(lock) in r.getMessage()], caplog.text


def test_a_fresh_unheld_lock_is_waited_out_within_the_bound_then_removed(tmp_path, old_torch, capsys):
    lock = _planted_lock(tmp_path / OP, age_s=0)
    start = time.monotonic()
    release_stale_jit_lock(tmp_path / OP, stale_s=1.5, poll_s=0.1)
    waited = time.monotonic() - start
    assert not lock.exists()
    assert 1.0 <= waited < 10, waited
    assert str(lock) in capsys.readouterr().err  # it said why it waits


def test_with_current_torch_a_fresh_unheld_lock_is_left_to_torchs_os_lock(tmp_path):
    lock = _planted_lock(tmp_path / OP, age_s=0)
    start = time.monotonic()
    release_stale_jit_lock(tmp_path / OP, stale_s=600)
    assert time.monotonic() - start < 5  # nothing to wait for: torch >= 2.14.1 takes the OS lock itself
    assert lock.exists()


HOLDERS = {
    "FileBaton (torch < 2.14)": "from torch.utils.file_baton import FileBaton; FileBaton(LOCK).try_acquire()",
    "FileLock (torch >= 2.14.1)": "from filelock import FileLock; held = FileLock(LOCK); held.acquire()",
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_lock_held_by_a_live_builder_is_kept(holder, tmp_path, old_torch):
    lock = _planted_lock(tmp_path / OP, age_s=3600)
    if "FileBaton" in holder:
        lock.unlink()  # the baton creates the file itself
    script = (
        f"LOCK = {str(lock)!r}\n{HOLDERS[holder]}\nprint('held', flush=True)\nimport time; time.sleep(60)"
    )
    builder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline().strip() == "held"
        stamp = time.time() - 3600
        os.utime(lock, (stamp, stamp))
        os.utime(tmp_path / OP, (stamp, stamp))
        release_stale_jit_lock(tmp_path / OP, stale_s=1)
        assert lock.exists()  # a live build keeps its lock; torch waits for it as it should
    finally:
        builder.kill()
        builder.wait()


def test_each_torch_version_builds_into_its_own_folder_once(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    tagged = torch_extensions_dir()
    assert tagged == str(tmp_path / "torch_extensions" / jit_ops_tag())
    assert jit_ops_tag().startswith("torch-") and f"py{sys.version_info.major}" in jit_ops_tag()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", tagged)  # a child of a prepared process: not tagged twice
    assert torch_extensions_dir() == tagged


def test_a_first_build_says_what_it_builds_and_about_how_long(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    before_jit_build(OP)
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"building DeepSpeed's {OP} op (first run") and "about 35 s" in line, line
    built = Path(torch_extensions_dir()) / OP
    built.mkdir(parents=True)
    (built / f"{OP}.so").touch()
    before_jit_build(OP)
    assert capsys.readouterr().err == ""  # built already: no word


#: A process with torch's old wait: detection reports FileBaton, and the build lock is taken the old way
#: (a lock file whose mere existence blocks) instead of the OS lock.
OLD_TORCH_LOAD = textwrap.dedent(
    """
    import torch.utils.cpp_extension as cpp_extension
    from torch.utils.file_baton import FileBaton

    class OldLock:
        def __init__(self, path):
            self.baton = FileBaton(path)
        def __enter__(self):
            while not self.baton.try_acquire():
                self.baton.wait()
        def __exit__(self, *exc):
            self.baton.release()

    cpp_extension.FileBaton, cpp_extension.FileLock = FileBaton, OldLock
    import functools
    from vlm_grpoma import distributed
    # The copied build is as young as this environment's (minutes, in CI): judge the folder stale after 5 s of
    # quiet, not 180 (that threshold has its own tests above), or this test waits out the difference.
    distributed.release_stale_jit_lock = functools.partial(distributed.release_stale_jit_lock, stale_s=5.0)
    distributed.import_deepspeed()
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
    ShareMemCommBuilder().load()
    print("loaded", flush=True)
    """
)


@pytest.mark.slow  # builds the op in a fresh folder unless this environment has built it
def test_old_torch_with_a_planted_stale_lock_loads_deepspeeds_op_instead_of_hanging(tmp_path):
    """The reproduction of the hang, end to end: DeepSpeed's real op load under torch's old lock-file wait."""
    root = tmp_path / "torch_extensions"
    build_dir = root / jit_ops_tag() / OP
    prepared = Path(torch_extensions_dir()) / OP
    # reuse this environment's build when there is one (mtimes kept: ninja rebuilds nothing)
    if (prepared / f"{OP}.so").is_file():
        shutil.copytree(prepared, build_dir, ignore=shutil.ignore_patterns("lock"))
    lock = _planted_lock(build_dir, age_s=3600)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "PYTHONPATH": PYTHONPATH, "DS_ACCELERATOR": "cpu"}
    env.pop("LOCAL_RANK", None)
    done = subprocess.run(
        [sys.executable, "-c", OLD_TORCH_LOAD], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("loaded"), done.stderr[-2000:]
    assert f"removed the stale JIT build lock {lock}" in done.stderr
