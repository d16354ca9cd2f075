"""The DeepSpeed JSON of a run: the ZeRO stage's shipped file (or the user's) with batch, precision and clipping
from the run config, and the training precision that the run config implies."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from vlm_grpoma.config import Config, ConfigError, gradient_accumulation_steps
from vlm_grpoma.models.loading import PRECISION_DTYPE_NAMES, TORCH_DTYPES

#: The ZeRO JSON files shipped inside the package (``vlm_grpoma/configs/deepspeed/zero{0,2,3}.json``).
SHIPPED_DEEPSPEED_CONFIGS = resources.files("vlm_grpoma") / "configs" / "deepspeed"


def resolve_precision(config: Config, on_gpu: bool) -> str:
    """``fp32`` / ``bf16`` / ``fp16`` from ``deepspeed.precision`` and ``model.dtype`` (which must agree)."""
    precision, dtype = config.deepspeed.precision, config.model.dtype
    key = "deepspeed.precision"  # the key that chose the precision, named when it cannot be used
    if precision == "auto":
        if dtype != "auto":
            precision = {name: p for p, name in PRECISION_DTYPE_NAMES.items()}[dtype]
            key = "model.dtype"
        else:
            precision = "bf16" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    elif dtype != "auto" and TORCH_DTYPES[dtype] != TORCH_DTYPES[PRECISION_DTYPE_NAMES[precision]]:
        raise ConfigError(
            f"model.dtype: {dtype} contradicts deepspeed.precision={precision}; set one of them to auto"
        )
    if precision == "fp16" and not on_gpu:  # DeepSpeed's CPU accelerator does bf16, not fp16 loss scaling
        asked = dtype if key == "model.dtype" else precision
        raise ConfigError(f"{key}: {asked} needs a GPU; CPU runs train in fp32 or bf16")
    return precision


def _base_deepspeed_json(config: Config) -> dict[str, Any]:
    """The JSON named by ``deepspeed.config_file``, else the shipped ``zero{stage}.json``."""
    stage = config.deepspeed.zero_stage
    if config.deepspeed.config_file:
        path: Path | Any = Path(config.deepspeed.config_file)
        key = "deepspeed.config_file"
    else:  # ZeRO-1 shares ZeRO-2's bucket settings; the stage is set below
        path = SHIPPED_DEEPSPEED_CONFIGS / f"zero{2 if stage == 1 else stage}.json"
        key = "deepspeed.zero_stage"
    if not path.is_file():
        raise ConfigError(f"{key}: DeepSpeed config {path} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{key}: {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} must hold a JSON object")
    return data


def deepspeed_config(config: Config, world_size: int, *, on_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config: the stage's JSON file with batch, precision and clipping from the run config.

    The run config wins over the JSON for ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps``, ``gradient_clipping``, ``bf16``/``fp16`` and the ZeRO stage.
    """
    precision = resolve_precision(config, on_gpu)
    ds = _base_deepspeed_json(config)
    zero = dict(ds.get("zero_optimization", {}))
    zero["stage"] = config.deepspeed.zero_stage
    if config.deepspeed.offload_optimizer:
        if config.deepspeed.zero_stage == 0:
            raise ConfigError("deepspeed.offload_optimizer: needs deepspeed.zero_stage >= 1")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    ds.update(
        train_batch_size=config.train.prompts_per_step,
        # token-budget runs: up to one micro-batch per prompt, the step's count set by TrainingEngine.plan_step
        train_micro_batch_size_per_gpu=1
        if config.train.micro_batch_tokens
        else config.train.micro_batch_prompts,
        gradient_accumulation_steps=config.train.prompts_per_step // world_size
        if config.train.micro_batch_tokens
        else gradient_accumulation_steps(config, world_size),
        gradient_clipping=config.optim.max_grad_norm,
        zero_optimization=zero,
        bf16={"enabled": precision == "bf16", "check_grad_overflow": True},
        fp16={"enabled": precision == "fp16"},
        zero_allow_untested_optimizer=True,
    )
    ds.setdefault("steps_per_print", 10**9)
    return ds
