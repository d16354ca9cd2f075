"""A run config checked against its model's architecture: LoRA targets, vision freeze, pixel bounds, row
lengths and batch arithmetic. Each problem is one line naming the config key."""

from __future__ import annotations

import json
from pathlib import Path

from vlm_grpoma.config import Config, ConfigError, validate
from vlm_grpoma.models.architecture import PixelBounds, find_architecture
from vlm_grpoma.planning.memory import Shapes
from vlm_grpoma.planning.model_stats import ModelStats


def checkpoint_pixel_bounds(name_or_path: str) -> PixelBounds | None:
    """The image processor bounds a checkpoint was released with: a local folder's processor config
    (``preprocessor_config.json``, or ``processor_config.json`` as transformers 5 writes it), else the shipped
    architecture's; None when unknown."""
    folder = Path(name_or_path)
    for name, section in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        if (folder / name).is_file():
            data = json.loads((folder / name).read_text())
            data = data.get(section, {}) if section else data
            size = data.get("size") or {}
            low = data.get("min_pixels") or size.get("shortest_edge")
            high = data.get("max_pixels") or size.get("longest_edge")
            if low and high and "patch_size" in data:
                return PixelBounds(
                    low,
                    high,
                    data["patch_size"],
                    data.get("merge_size", 2),
                    data.get("temporal_patch_size", 2),
                )
    arch = find_architecture(name_or_path)
    return arch.processor if arch is not None else None


def lora_target_problems(config: Config, stats: ModelStats) -> list[str]:
    """LoRA target names that match no linear layer of the language model."""
    lora = config.model.lora
    unknown = [name for name in lora.target_modules if name not in stats.text_linear_names]
    if not lora.enabled or not unknown:
        return []
    return [
        f"model.lora.target_modules: {', '.join(unknown)} name no linear layer of the language model "
        f"(it has {', '.join(sorted(stats.text_linear_names))})"
    ]


def config_problems(config: Config, stats: ModelStats, shape: Shapes, world_size: int) -> list[str]:
    """Everything about ``config`` that contradicts its model or hardware (empty: consistent)."""
    problems = lora_target_problems(config, stats)
    if config.model.freeze_vision and stats.trainable_vision:
        problems.append(
            f"model.freeze_vision: true, but {stats.trainable_vision:,} vision parameters would train"
        )
    if not config.model.freeze_vision and not stats.trainable_vision:
        problems.append("model.freeze_vision: false, but no vision parameter would train")
    factor = stats.family.factor
    m = config.model
    if m.min_pixels < factor * factor:
        problems.append(
            f"model.min_pixels: {m.min_pixels} is below one image token ({factor} x {factor} pixels)"
        )
    bounds = checkpoint_pixel_bounds(m.name_or_path)
    if bounds is not None:
        if bounds.factor != factor:
            problems.append(
                f"model.name_or_path: the processor's {bounds.factor}-px tokens differ from the family's {factor}"
            )
        if m.max_pixels > bounds.max_pixels:
            problems.append(
                f"model.max_pixels: {m.max_pixels} exceeds the checkpoint processor's {bounds.max_pixels}"
            )
        if m.min_pixels < bounds.min_pixels:
            problems.append(
                f"model.min_pixels: {m.min_pixels} is below the checkpoint processor's {bounds.min_pixels}"
            )
    longest = shape.naive_row  # rope positions of a packed answer continue its own thought, not the row
    if longest > stats.text.max_positions:
        problems.append(
            f"rollout: prompt + thought + answer ({longest} tokens) exceed the model's "
            f"{stats.text.max_positions} positions"
        )
    max_len = config.rollout.vllm.max_model_len
    if config.rollout.backend == "vllm" and max_len and longest > max_len:
        problems.append(
            f"rollout.vllm.max_model_len: {max_len} is shorter than prompt + thought + answer ({longest} tokens)"
        )
    try:
        validate(config, world_size)
    except ConfigError as err:
        problems.append(str(err))
    return problems
