"""Adapter registry keyed by the checkpoint's ``model_type``: the family of a checkpoint and its adapter."""

from __future__ import annotations

from pathlib import Path

from vlm_grpoma.config import ModelConfig
from vlm_grpoma.errors import UserError
from vlm_grpoma.models.families import FAMILIES, QwenFamily
from vlm_grpoma.models.model_files import check_model_source, model_load_errors
from vlm_grpoma.models.qwen import QwenVLAdapter
from vlm_grpoma.models.sources import adapter_chain

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)
#: Files that make a folder loadable by ``AutoProcessor`` on their own.
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")


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


def _processor_source(name_or_path: str, base: str) -> str:
    """Where the processor is: the folder itself unless it is an adapter folder saved without one."""
    if name_or_path != base and not any((Path(name_or_path) / f).is_file() for f in _PROCESSOR_FILES):
        return base
    return name_or_path


def load_adapter(config: ModelConfig) -> QwenVLAdapter:
    """The processor and adapter of a checkpoint (local folder, hub id or LoRA adapter folder), without the
    weights; an adapter folder takes its architecture from its base model and its processor from itself when
    it has one (our checkpoints save it), else from the base. A source that cannot be loaded is one line
    (:mod:`~vlm_grpoma.models.model_files`)."""
    from transformers import AutoConfig, AutoProcessor

    check_model_source(config.name_or_path)
    chain = adapter_chain(config.name_or_path)
    with model_load_errors(config.name_or_path):
        model_type = AutoConfig.from_pretrained(
            chain.base, trust_remote_code=config.trust_remote_code
        ).model_type
        family = family_for(model_type, config.name_or_path)
        source = _processor_source(config.name_or_path, chain.base)
        processor = AutoProcessor.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    return QwenVLAdapter(
        family,
        processor,
        config.min_pixels,
        config.max_pixels,
        config.prompt_style,
        config.thinking,
        config.max_images,
        config.max_video_frames,
    )
