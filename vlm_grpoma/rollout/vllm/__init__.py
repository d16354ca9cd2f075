"""vLLM rollout backend: a colocated ``vllm.LLM`` per rank samples the K x M tree (CUDA or CPU build of vLLM).

One job per module, lowest first: ``stack`` (which vLLM build is installed, the known-good versions),
``options`` (how the engine is built per platform), ``requests`` (phase-1, closing and phase-2 requests),
``outputs`` (vLLM's outputs read into the RolloutTree), ``weights`` (naming and merging for weight sync) and
``engine`` (the engine itself). CUDA and CPU builds share every step except four, each named: the KV block
size, prompts prefilled whole, sleep mode (``options``) and re-packing a tied output layer after a reload
(``weights``). What does not need vLLM (all but the engine's calls into it and that re-packing) is unit-tested
without it (``tests/rollout/test_vllm_cpu_side.py``); the engine is tested for real with the CPU build
(``make test-vllm``).

The names below load their module on first use, so ``vlm_grpoma.rollout.vllm.stack`` (``vlm-grpoma env``) is
read without the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module of this package that defines it (imported on first access).
EXPORTS: dict[str, str] = {
    "INSTALL_HINT": "stack",
    "KNOWN_GOOD": "stack",
    "VLLMBuild": "stack",
    "installed_vllm": "stack",
    "import_vllm": "stack",
    "stack_problems": "stack",
    "VLLMOptions": "options",
    "engine_arguments": "options",
    "RequestBuilder": "requests",
    "first_stop": "outputs",
    "assemble_tree": "outputs",
    "merged_weights": "weights",
    "VLLMRolloutEngine": "engine",
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
