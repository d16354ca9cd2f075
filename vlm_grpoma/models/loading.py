"""Loading a Qwen-VL checkpoint's weights and making it trainable: dtype, attention, gradient checkpointing,
the vision freeze and LoRA. The one place that maps dtype names to torch dtypes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from vlm_grpoma.config import ConfigError, ModelConfig
from vlm_grpoma.models.attention import hf_attn_implementation
from vlm_grpoma.models.model_files import check_model_source, model_load_errors
from vlm_grpoma.models.qwen import QwenVLAdapter
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.models.sources import adapter_chain, local_path

#: ``model.dtype`` names and the torch dtypes they load as.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
#: ``deepspeed.precision`` names and the ``model.dtype`` name each trains in.
PRECISION_DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: Module names that hold a VLM's vision encoder (Qwen-VL: ``model.visual``).
VISION_MODULE_NAMES = ("visual", "vision_tower", "vision_model")


def vision_module_names(model: torch.nn.Module) -> list[str]:
    """Top-level names of the vision encoder modules (e.g. ``model.visual``)."""
    names = [n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in VISION_MODULE_NAMES]
    return [n for n in names if not any(n.startswith(other + ".") for other in names)]


def _in_any(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@contextmanager
def _without_zero3_partitioning() -> Iterator[None]:
    """Load whole (unpartitioned) weights even inside a ZeRO-3 run, so LoRA deltas can be merged into them;
    DeepSpeed partitions the merged model when it wraps it."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    active = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if active is not None:
            hf_deepspeed.set_hf_deepspeed_config(active)


def load_pretrained(model_cfg: ModelConfig, dtype: torch.dtype | str) -> torch.nn.Module:
    """``AutoModelForImageTextToText.from_pretrained`` with the configured dtype and attention.

    ``model.name_or_path`` may be a LoRA adapter folder (a LoRA run's ``model/``): its base model is loaded
    and every adapter of the chain merged into it, and the model keeps the adapter folder as its name, so a
    new LoRA trained on top records that folder (not the bare base) as its own base. A source that cannot be
    loaded (missing, uncached offline, damaged files) is one line (:mod:`~vlm_grpoma.models.model_files`).
    """
    from transformers import AutoModelForImageTextToText

    check_model_source(model_cfg.name_or_path)
    chain = adapter_chain(model_cfg.name_or_path)

    def base() -> torch.nn.Module:
        with model_load_errors(model_cfg.name_or_path):
            return AutoModelForImageTextToText.from_pretrained(
                chain.base,
                dtype=dtype,
                attn_implementation=hf_attn_implementation(model_cfg.attn_implementation),
                trust_remote_code=model_cfg.trust_remote_code,
            )

    if not chain.is_adapter:
        return base()
    from peft import PeftModel

    with _without_zero3_partitioning():
        model = base()
        for folder in chain.adapters:
            model = PeftModel.from_pretrained(model, folder).merge_and_unload()
    name = local_path(model_cfg.name_or_path)
    model.name_or_path = model.config.name_or_path = name
    return model


def prepare_trainable(model: torch.nn.Module, model_cfg: ModelConfig) -> torch.nn.Module:
    """Gradient checkpointing, the vision freeze and LoRA; returns the module to train (PeftModel with LoRA).

    With LoRA, adapters go on the language model's ``lora.target_modules`` only; ``freeze_vision: false``
    trains the whole vision tower as a peft ``modules_to_save`` copy, so disabling the adapters still gives
    the original (reference) vision tower.
    """
    if model_cfg.gradient_checkpointing:  # non-reentrant: works with frozen inputs (LoRA) and ZeRO-3
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vision = vision_module_names(model)
    if not model_cfg.lora.enabled:
        if model_cfg.freeze_vision:
            for name, param in model.named_parameters():
                if _in_any(name, vision):
                    param.requires_grad_(False)
        return model

    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lora = model_cfg.lora
    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora_target_pattern(model, lora.target_modules),
        modules_to_save=None if model_cfg.freeze_vision else vision,
    )
    return get_peft_model(model, peft_config)


def lora_targets(model: torch.nn.Module, target_modules: list[str]) -> list[str]:
    """Full names of the language model's linear layers whose last name part is in ``target_modules``."""
    vision = vision_module_names(model)
    targets = sorted(
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and name.rsplit(".", 1)[-1] in target_modules
        and not _in_any(name, vision)
    )
    if not targets:
        raise ConfigError(
            f"model.lora.target_modules: none of {target_modules} names a linear layer of the language model"
        )
    return targets


def lora_target_pattern(model: torch.nn.Module, target_modules: list[str]) -> str:
    r"""One regex that PEFT full-matches against module names, matching exactly :func:`lora_targets`.

    Written from the family's own module names as ``<layer list>.<index>.<module path>``, e.g.
    ``(?:model\.language_model\.layers)\.\d+\.(?:mlp\.down_proj|...|self_attn\.v_proj)``; where that
    would match other modules too, the target names themselves. PEFT stores a string verbatim in
    ``adapter_config.json`` (a list it rewrites into name suffixes, which can match vision modules), so a saved
    adapter reloads onto the same modules.
    """
    targets = lora_targets(model, target_modules)
    parts = [re.fullmatch(r"(.+?)\.(\d+)\.(.+)", name) for name in targets]
    if all(parts):
        lists = sorted({p.group(1) for p in parts})
        paths = sorted({p.group(3) for p in parts})
        pattern = rf"(?:{'|'.join(map(re.escape, lists))})\.\d+\.(?:{'|'.join(map(re.escape, paths))})"
        if sorted(name for name, _ in model.named_modules() if re.fullmatch(pattern, name)) == targets:
            return pattern
    return f"(?:{'|'.join(map(re.escape, targets))})"


def is_peft(module: torch.nn.Module) -> bool:
    """A PEFT-wrapped model (LoRA adapters)."""
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


@dataclass
class LoadedModel:
    """A checkpoint's model (for inference: eval and manipulation evaluation) and its adapter."""

    model: Any
    adapter: QwenVLAdapter


def load_model(config: ModelConfig) -> LoadedModel:
    """Model (dtype and attention implementation from the config; ``auto`` keeps the checkpoint's) + adapter."""
    adapter = load_adapter(config)
    dtype = "auto" if config.dtype == "auto" else TORCH_DTYPES[config.dtype]
    return LoadedModel(model=load_pretrained(config, dtype), adapter=adapter)
