"""The package as a user installs it: sdist and wheel built offline (no build isolation); the sdist holds the
whole source tree, the wheel every file of ``vlm_grpoma/`` (code and package data); the wheel installed non-editable into a fresh venv, used from a folder outside the
repository: ``env``, ``make-tiny-model``, ``make-data``, 2 steps of ``train`` with ZeRO-2 on the shipped demo
config, and ``launch-scripts``.

The fresh venv reuses this test environment's dependencies through a ``.pth`` line naming its site-packages:
a plain path line adds the folder but runs none of its ``.pth`` files, so the checkout's editable install
(a meta-path finder installed by such a file) stays off, and the wheel's copy in the venv's own site-packages
comes first on ``sys.path``. The test checks which copy ran.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from launch_support import REPO

from vlm_grpoma import __version__

DIST = f"vlm_grpoma-{__version__}"
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist", "runs", "data", "__pycache__")


def source_files() -> list[str]:
    """The checkout's files as a clone has them (git's view when there is one), relative to the root."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return []
    return [name for name in listed if os.path.lexists(REPO / name)]


def copy_source(dest: Path) -> None:
    files = source_files()
    if not files:
        shutil.copytree(REPO, dest, symlinks=True, ignore=NOT_SOURCE)
        return
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name, follow_symlinks=False)


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """sdist from a copy of the checkout, then the wheel from the unpacked sdist (as `python -m build` does),
    both offline with this environment's setuptools."""
    root = tmp_path_factory.mktemp("build")
    src, dist = root / "src", root / "dist"
    copy_source(src)
    tree = {
        p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    sdist = dist / run([sys.executable, "-c", code, dist], cwd=src).stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-q"]
        + ["-w", dist, root / "unpacked" / DIST],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    [wheel] = dist.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "tree": tree}


def test_sdist_holds_the_source_tree_and_the_wheel_every_package_file(built):
    package = {name for name in built["tree"] if name.startswith("vlm_grpoma/")}
    assert {
        "vlm_grpoma/configs/deepspeed/zero2.json",
        "vlm_grpoma/configs/demo_detection.yaml",
        "vlm_grpoma/configs/demo_manipulation.yaml",
    } <= package
    assert {"vlm_grpoma/launch/train.sh", "vlm_grpoma/envs/sapien/fetch_mesa.sh"} <= package

    with tarfile.open(built["sdist"]) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert built["tree"] <= in_sdist, f"missing from the sdist: {sorted(built['tree'] - in_sdist)}"
    assert {"PKG-INFO", "tests/launch/test_wheel.py", "launch/train.sh", "Makefile"} <= in_sdist

    with zipfile.ZipFile(built["wheel"]) as whl:
        in_wheel = {info.filename: info for info in whl.infolist()}
        entry_points = whl.read(f"{DIST}.dist-info/entry_points.txt").decode()
    assert package <= set(in_wheel), f"missing from the wheel: {sorted(package - set(in_wheel))}"
    assert {name.split("/")[0] for name in in_wheel} == {"vlm_grpoma", f"{DIST}.dist-info"}
    assert "vlm-grpoma = vlm_grpoma.cli:main" in entry_points
    assert in_wheel["vlm_grpoma/launch/train.sh"].external_attr >> 16 & 0o111  # stays executable


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel (not editable), borrowing this environment's dependencies."""
    fresh = tmp_path_factory.mktemp("venv") / "fresh"
    run([sys.executable, "-m", "venv", "--without-pip", fresh])
    purelib = Path(
        run(
            [fresh / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    # Real paths: the same spelling of DeepSpeed's folder as the launcher uses, so JIT ops are not rebuilt.
    borrowed = [os.path.realpath(p) for p in site.getsitepackages()]
    (purelib / "_borrowed_test_env.pth").write_text("\n".join(borrowed) + "\n")
    # ...and the one executable of theirs the suite runs: ninja, for DeepSpeed's JIT builds (pip puts it in bin/).
    if ninja := shutil.which("ninja", path=str(Path(sys.executable).parent)):
        os.symlink(ninja, fresh / "bin" / "ninja")
    # --ignore-installed: pip must not touch the checkout's own (editable) vlm-grpoma it can see.
    run(
        [
            fresh / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
        ]
        + [built["wheel"]],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return fresh


@pytest.mark.slow
def test_installed_wheel_works_outside_the_checkout(venv, tmp_path):
    user = tmp_path / "user"  # a folder of the user's, far from the checkout
    user.mkdir()
    drop = (
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "VLM_GRPOMA_CACHE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        XDG_CACHE_HOME=str(tmp_path / "xdg"),  # the user's cache: nothing of the checkout's
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    assert env["TORCH_EXTENSIONS_DIR"]  # the project's JIT ops (set by conftest/Makefile): no 35 s rebuild

    def vlm(*args) -> subprocess.CompletedProcess:
        return run([venv / "bin" / "vlm-grpoma", *args], cwd=user, env=env)

    report = json.loads(vlm("env", "--json").stdout)
    installed = Path(report["vlm_grpoma"]["location"])
    assert installed.is_relative_to(venv) and not installed.is_relative_to(REPO)
    assert report["vlm_grpoma"]["cache"] == str(tmp_path / "xdg" / "vlm-grpoma")
    assert report["probes"]["deepspeed_distributed"]["ok"], report["probes"]

    vlm("make-tiny-model", "--arch", "qwen2_5_vl", "--out", "tiny")
    vlm(
        "make-data",
        "--task",
        "detection",
        "--source",
        "shapes",
        "--n",
        "8",
        "--out",
        "data",
        "--difficulty",
        "easy",
    )
    # the shipped config, read from the installed package
    demo = installed / "configs" / "demo_detection.yaml"
    trained = vlm(
        "train", "--config", demo, "model.name_or_path=tiny", "data.train_path=data/records.jsonl",
        "logging.output_dir=run", "logging.progress_bar=false", "deepspeed.zero_stage=2", "train.steps=2",
        "train.prompts_per_step=2", "train.micro_batch_prompts=1", "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2", "rollout.max_thought_tokens=8", "rollout.max_answer_tokens=8",
    )  # fmt: skip
    assert "trained 2 steps" in trained.stdout
    meta = json.loads((user / "run" / "checkpoints" / "step-00000002" / "checkpoint.json").read_text())
    assert meta["zero_stage"] == 2 and meta["world_size"] == 1
    assert (user / "run" / "checkpoints" / "step-00000002" / "model" / "model.safetensors").is_file()

    vlm("launch-scripts", "--out", "launch")
    for name in ("train.sh", "slurm.sbatch", "hostfile.example"):
        assert (user / "launch" / name).read_bytes() == (installed / "launch" / name).read_bytes()
    shown = subprocess.run(["bash", user / "launch" / "train.sh", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("Train under the DeepSpeed launcher")
