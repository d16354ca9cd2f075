"""What the memory formulas need to know about a run's model, read from its meta-device instance: parameter
counts (total, trainable after the vision freeze and LoRA, the largest layer) and the layer dimensions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlm_grpoma.config import Config, ConfigError
from vlm_grpoma.models.architecture import meta_model, model_config
from vlm_grpoma.models.families import FAMILIES, QwenFamily
from vlm_grpoma.models.loading import prepare_trainable, vision_module_names


@dataclass(frozen=True)
class TextDims:
    """The language model's sizes (per decoder layer and overall)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int


@dataclass(frozen=True)
class VisionDims:
    """The vision tower's sizes; ``merge`` patches per side make one image token."""

    depth: int
    hidden: int
    intermediate: int


@dataclass(frozen=True)
class ModelStats:
    """Parameter counts of the model as the run trains it, and its dimensions."""

    source: str  # where the architecture came from (a local config.json or a shipped architecture)
    family: QwenFamily
    base_parameters: int  # the checkpoint's parameters
    total: int  # parameters held in training: the base, LoRA adapters and trainable copies (modules_to_save)
    trainable: int
    vision: int
    trainable_vision: int
    largest_layer: int  # parameters held directly by one module (ZeRO-3 gathers one at a time)
    lora_targets: int  # linear layers carrying an adapter (0 without LoRA)
    text_linear_names: frozenset[str]  # last name parts of the language model's linear layers (q_proj, ...)
    text: TextDims
    vision_dims: VisionDims

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def _vision_dims(vision: Any) -> VisionDims:
    hidden = getattr(vision, "embed_dim", None) or vision.hidden_size  # Qwen2-VL calls it embed_dim
    intermediate = getattr(vision, "intermediate_size", None) or int(hidden * vision.mlp_ratio)
    return VisionDims(depth=vision.depth, hidden=hidden, intermediate=intermediate)


def model_stats(config: Config) -> ModelStats:
    """Build the run's model on the meta device, apply its vision freeze and LoRA, and count."""
    import torch

    hf_config, source = model_config(config.model.name_or_path)
    if hf_config.model_type not in FAMILIES:
        raise ConfigError(
            f"model.name_or_path: model_type {hf_config.model_type!r} is not supported ({', '.join(FAMILIES)})"
        )
    base = meta_model(hf_config)
    base_parameters = sum(p.numel() for p in base.parameters())
    vision_names = vision_module_names(base)
    vision = sum(p.numel() for n in vision_names for p in base.get_submodule(n).parameters())
    text_linear_names = frozenset(
        name.rsplit(".", 1)[-1]
        for name, module in base.named_modules()
        if isinstance(module, torch.nn.Linear) and not any(name.startswith(v + ".") for v in vision_names)
    )
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in base.modules())
    with torch.device("meta"):  # adapters and trainable copies are created on the meta device too
        model = prepare_trainable(base, config.model)
    named = list(model.named_parameters())
    text = hf_config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return ModelStats(
        source=source,
        family=FAMILIES[hf_config.model_type],
        base_parameters=base_parameters,
        total=sum(p.numel() for _, p in named),
        trainable=sum(p.numel() for _, p in named if p.requires_grad),
        vision=vision,
        trainable_vision=sum(p.numel() for n, p in named if p.requires_grad and ".visual." in f".{n}"),
        largest_layer=largest,
        lora_targets=sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A")),
        text_linear_names=text_linear_names,
        text=TextDims(
            layers=text.num_hidden_layers,
            hidden=text.hidden_size,
            intermediate=text.intermediate_size,
            heads=text.num_attention_heads,
            kv_heads=text.num_key_value_heads,
            head_dim=head_dim,
            vocab=text.vocab_size,
            max_positions=text.max_position_embeddings,
        ),
        vision_dims=_vision_dims(hf_config.vision_config),
    )
