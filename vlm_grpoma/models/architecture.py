"""The public architectures of the supported checkpoints, shipped as data: config values, pixel bounds, sources.

Each ``vlm_grpoma/models/architectures/<name>.json`` holds the ``config.json`` values of one released
checkpoint (e.g. Qwen2.5-VL-3B-Instruct), its processor's pixel bounds and where the values were read. They
let the planner and the tests build every real architecture on the meta device (no weights, no download)
and let benchmarks build a random model of real size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from vlm_grpoma.errors import ConfigError

#: The shipped architecture files (package data, read with importlib.resources).
ARCHITECTURE_DIR = resources.files("vlm_grpoma") / "models" / "architectures"


@dataclass(frozen=True)
class PixelBounds:
    """The checkpoint's image processor: pixel bounds of a resized image and its patching."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int

    @property
    def factor(self) -> int:
        """Image sides are multiples of this many pixels (one merged vision token)."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class Architecture:
    """One released checkpoint's architecture: its ``config.json`` values and processor bounds."""

    name: str
    hub_id: str
    config: dict[str, Any]
    processor: PixelBounds
    sources: tuple[str, ...]

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    def transformers_config(self, **text_overrides: Any) -> Any:
        """The transformers config, as ``from_pretrained`` would read it; ``text_overrides`` (e.g.
        ``num_hidden_layers=2``) change the language model's values, for smaller stand-ins."""
        from transformers import AutoConfig

        config = AutoConfig.for_model(**self.config)
        text = config.get_text_config()
        for key, value in text_overrides.items():
            if not hasattr(text, key):
                raise ConfigError(f"{self.name}: the language model config has no {key!r}")
            setattr(text, key, value)
        return config


def architecture_names() -> tuple[str, ...]:
    """Names of the shipped architectures (e.g. ``Qwen2-VL-2B-Instruct``), sorted."""
    return tuple(sorted(arch.name for arch in _all()))


@cache
def _all() -> tuple[Architecture, ...]:
    found = []
    for entry in ARCHITECTURE_DIR.iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            found.append(
                Architecture(
                    name=data["name"],
                    hub_id=data["hub_id"],
                    config=data["config"],
                    processor=PixelBounds(**data["processor"]),
                    sources=tuple(data["sources"]),
                )
            )
    return tuple(found)


def find_architecture(name_or_path: str) -> Architecture | None:
    """The shipped architecture named by a hub id (``Qwen/Qwen2-VL-2B-Instruct``), a name or a path ending
    in one (case-insensitive); None when none matches."""
    key = name_or_path.rstrip("/").lower()
    for arch in _all():
        if key == arch.hub_id.lower() or key.rsplit("/", 1)[-1] == arch.name.lower():
            return arch
    return None


def load_architecture(name: str) -> Architecture:
    """:func:`find_architecture`, or a ConfigError listing the shipped names."""
    arch = find_architecture(name)
    if arch is None:
        raise ConfigError(
            f"unknown architecture {name!r}; shipped architectures: {', '.join(architecture_names())}"
        )
    return arch


def model_config(name_or_path: str) -> tuple[Any, str]:
    """The transformers config of ``model.name_or_path`` without weights: a local folder's ``config.json``,
    else the shipped architecture of that hub id or name; (config, where it came from)."""
    from transformers import AutoConfig

    if (Path(name_or_path) / "config.json").is_file():
        return AutoConfig.from_pretrained(name_or_path), f"{Path(name_or_path) / 'config.json'}"
    arch = find_architecture(name_or_path)
    if arch is None:
        raise ConfigError(
            f"model.name_or_path: {name_or_path!r} is neither a folder with config.json nor a shipped "
            f"architecture ({', '.join(architecture_names())})"
        )
    return arch.transformers_config(), f"shipped architecture {arch.name}"


def meta_model(config: Any) -> Any:
    """``AutoModelForImageTextToText`` of ``config`` on the meta device: every module and parameter shape,
    no memory, no weights."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)
