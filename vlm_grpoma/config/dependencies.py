"""Optional packages the config asks for, found (not imported) before any model loads."""

from __future__ import annotations

import importlib.util

from vlm_grpoma.config.sections import Config
from vlm_grpoma.errors import MissingDependencyError

#: the commands that sample rollouts (rollout.backend) and those that log a run (logging.wandb_project)
_ROLLOUT_COMMANDS = ("train",)
_LOGGING_COMMANDS = ("train", "sft")


def check_optional_dependencies(config: Config, command: str) -> None:
    """Raise one line naming the key when ``command`` would need a package this environment lacks.

    vLLM for ``rollout.backend=vllm`` (train), wandb for ``logging.wandb_project`` (train, sft). No config key
    needs pyarrow (only ``convert --from parquet``, which checks it first) or pycocotools (``eval`` skips COCO
    AP with a note without it)."""
    if command in _ROLLOUT_COMMANDS and config.rollout.backend == "vllm" and not _installed("vllm"):
        raise MissingDependencyError(
            "rollout.backend=vllm needs vLLM, which is not installed here: on a CUDA machine install the "
            "vllm extra (pip install './vlm-grpoma[vllm]'), on CPU run `make setup-vllm`; "
            "or use rollout.backend=hf"
        )
    if command in _LOGGING_COMMANDS and config.logging.wandb_project and not _installed("wandb"):
        raise MissingDependencyError(
            f"logging.wandb_project={config.logging.wandb_project} needs wandb, which is not installed here: "
            "pip install wandb, or leave logging.wandb_project empty"
        )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
