"""Adapter registry keyed by the checkpoint's ``model_type``: the family of a checkpoint and its adapter."""

from __future__ import annotations

from vlm_grpoma.config import ModelConfig
from vlm_grpoma.errors import UserError
from vlm_grpoma.models.families import FAMILIES, QwenFamily
from vlm_grpoma.models.qwen import QwenVLAdapter

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)


class UnsupportedModelError(UserError, ValueError):
    """A checkpoint whose ``model_type`` has no adapter."""


def family_for(model_type: str, source: str = "") -> QwenFamily:
    """The family of ``model_type``, or an error naming it and listing the supported ones."""
    if model_type not in FAMILIES:
        where = f" (checkpoint {source})" if source else ""
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r}{where}; supported model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return FAMILIES[model_type]


def load_adapter(config: ModelConfig) -> QwenVLAdapter:
    """The processor and adapter of a checkpoint (local folder or hub id), without the weights."""
    from transformers import AutoConfig, AutoProcessor

    source = config.name_or_path
    model_type = AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code).model_type
    family = family_for(model_type, source)
    processor = AutoProcessor.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    return QwenVLAdapter(
        family, processor, config.min_pixels, config.max_pixels, config.prompt_style, config.thinking
    )
