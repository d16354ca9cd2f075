"""scripts/device_check.sh: the dry run lists what it would install and run and exits 0; on a machine without
CUDA the real run stops at one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _check(*args: str, wheels: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DEVICE_WHEELS": str(wheels),
        "OUT": str(wheels.parent / "out"),
    }
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "device_check.sh"), *args], env=env, capture_output=True, text=True
    )


def test_dry_run_lists_the_wheels_installs_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("deepspeed-0.19.8-py3-none-any.whl", "qwen_vl_utils-0.0.14-py3-none-any.whl"):
        (wheels / name).write_bytes(b"x" * 1000)
    (wheels / "dashscope-2.0.2-py3-none-any.whl").write_bytes(b"x")  # the tokenizer's ranks, never installed
    result = _check("--dry-run", wheels=wheels)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "deepspeed-0.19.8-py3-none-any.whl" in out and "qwen_vl_utils-0.0.14" in out
    install = next(line for line in out.splitlines() if line.startswith("+") and "--target" in line)
    assert "--no-index --no-deps" in install and "dashscope" not in install
    assert "--no-deps --no-build-isolation" in out  # the project itself
    assert "pytest -m gpu tests/gpu" in out and "gpu_tests.xml" in out
    assert out.count("benchmarks/real_size.py --model Qwen2.5-VL-3B-Instruct") == 2
    assert "--thoughts 4 --answers 4" in out and "--thoughts 16 --answers 1" in out
    assert "scripts/device_report.py" in out and "dry run: nothing installed or run" in out
    assert not (tmp_path / "out").exists()
    # every script and test the dry run names exists
    for path in ("tests/gpu/test_gpu.py", "benchmarks/real_size.py", "scripts/device_report.py"):
        assert (REPO / path).is_file(), path


def test_dry_run_without_wheels_says_how_to_fetch_them(tmp_path):
    result = _check("--dry-run", wheels=tmp_path / "none")
    assert result.returncode == 0
    assert "wheels: none in" in result.stdout and "scripts/fetch_device_wheels.sh" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_the_check_stops_at_one_line(tmp_path):
    result = _check(wheels=tmp_path / "none")
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [
        f"device check: torch {torch.__version__} sees no CUDA device"
    ]


def test_bad_option_is_refused(tmp_path):
    result = _check("--wet-run", wheels=tmp_path)
    assert result.returncode == 2 and "usage:" in result.stderr
