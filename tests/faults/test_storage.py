"""A full disk and a read-only output folder, made real with a small tmpfs / a read-only bind mount in a user
and mount namespace: one line naming the path, exit code 1, and the newest checkpoint intact."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from fault_runs import FAULT_CLI, PYTHONPATH, error_lines

from vlm_grpoma.trainer.checkpoint import list_checkpoints, verify_checkpoint


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_work(), reason="needs unprivileged user+mount namespaces (unshare) to mount a small tmpfs"
)


def _in_namespace(script: str, command: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run sh ``script`` (``"$@"`` is ``command``; ``env`` added) as root of a fresh user+mount namespace."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "HOME", "TORCH_EXTENSIONS_DIR", "VLM_GRPOMA_CACHE")
    }
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        timeout=300,
        env={**kept, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1", **env},
    )


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_disk_full_while_saving_a_checkpoint(overrides, tmp_path):
    out, kept = tmp_path / "run", tmp_path / "kept"
    out.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    train = [sys.executable, str(FAULT_CLI), "train", "--config", str(config)]
    train += overrides(out, "train.steps=3", "checkpoint.save_every=1")
    # ~3.5 MB per checkpoint of the tiny model: the first fits in 6 MB, the second does not.
    script = 'mount -t tmpfs -o size=6m tmpfs "$OUT" && "$@"; rc=$?; cp -a "$OUT" "$KEPT"; exit $rc'
    result = _in_namespace(script, train, OUT=str(out), KEPT=str(kept))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result.stderr)
    assert line == (
        f"vlm-grpoma train: error: saving the checkpoint of step 2: disk full: {out}/checkpoints/.tmp-step-00000002; "
        "the newest complete checkpoint, step-00000001, is intact; make room and continue with checkpoint.resume=auto"
    )
    (newest,) = list_checkpoints(kept)
    verify_checkpoint(newest)  # sizes and hashes as written


def test_read_only_output_folder(overrides, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    train = [
        sys.executable,
        str(FAULT_CLI),
        "train",
        "--config",
        str(config),
        *overrides(out, "train.steps=1"),
    ]
    result = _in_namespace(
        'mount --bind "$OUT" "$OUT" && mount -o remount,ro,bind "$OUT" && exec "$@"', train, OUT=str(out)
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        f"vlm-grpoma train: error: logging.output_dir: read-only file system: {out}/.vlm-grpoma.lock"
    ]


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_disk_full_while_writing_metrics_is_one_line_not_masked_by_closing(overrides, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    train = [sys.executable, str(FAULT_CLI), "train", "--config", str(config)]
    train += overrides(out, "train.steps=40", "logging.tensorboard=true")
    # A 1 MiB tmpfs filled up to its last 6 pages: the lock and config.yaml fit, the metrics soon do not.
    script = (
        'mount -t tmpfs -o size=1m tmpfs "$OUT" && dd if=/dev/zero of="$OUT/filler" bs=4096 count=250 '
        '2> /dev/null; exec "$@"'
    )
    result = _in_namespace(script, train, OUT=str(out))
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith("vlm-grpoma train: error: writing metrics: disk full: "), line
    # closing the files failed again, and said so without replacing that line (TensorBoard's writer thread
    # prints its own traceback: the library's, not the run's)
    assert "closing the metrics files failed too" in result.stderr
