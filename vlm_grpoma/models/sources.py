"""Where a model comes from: a full Hugging Face folder (or hub id), or a LoRA adapter folder on top of one.

A LoRA checkpoint's ``model/`` folder holds only the adapter (``adapter_config.json``); its base is named by
the adapter config's ``base_model_name_or_path``, which may itself be an adapter folder (SFT with LoRA, then
GRPO-MA with LoRA from it). :func:`adapter_chain` follows those links down to the full model, so everything
that loads a model (training, ``eval``, ``manip-eval``) accepts both kinds of folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.errors import CheckpointError

ADAPTER_CONFIG = "adapter_config.json"
#: A Hugging Face hub id ("org/name"), as opposed to a local path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
#: An adapter chain longer than this is a cycle in the base links, not a training history.
_MAX_CHAIN = 32


def is_adapter_folder(name_or_path: str | Path) -> bool:
    """A local folder holding a PEFT adapter (``adapter_config.json``) and no full model (``config.json``)."""
    folder = Path(name_or_path)
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def local_path(name_or_path: str | Path) -> str:
    """An existing local folder as an absolute path (so a saved adapter names its base from anywhere);
    anything else (a hub id) unchanged."""
    text = str(name_or_path)
    return os.path.abspath(text) if text and os.path.isdir(text) else text


def _base_of(adapter: Path) -> str:
    """The base model an adapter folder names, as a usable local path or hub id; CheckpointError otherwise."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{adapter / ADAPTER_CONFIG}: cannot read the adapter config: {err}") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise CheckpointError(
            f"{adapter / ADAPTER_CONFIG}: names no base_model_name_or_path; write the base model's folder "
            "or hub id there"
        )
    if os.path.isdir(base):
        return local_path(base)
    beside = adapter / base  # a relative base saved by hand next to the adapter
    if not os.path.isabs(base) and beside.is_dir():
        return str(beside.resolve())
    if _HUB_ID.fullmatch(base) and not base.startswith((".", "/")):
        return base
    raise CheckpointError(
        f"{adapter}: is a LoRA adapter whose base model {base!r} (base_model_name_or_path in "
        f"{ADAPTER_CONFIG}) is not found; put that folder back or edit the path to where it now is"
    )


@dataclass(frozen=True)
class AdapterChain:
    """A model folder resolved to its full base model and the adapters to apply to it, base first."""

    base: str
    adapters: tuple[str, ...]

    @property
    def is_adapter(self) -> bool:
        return bool(self.adapters)


def adapter_chain(name_or_path: str | Path) -> AdapterChain:
    """The full model at the bottom of ``name_or_path`` and the adapter folders above it (none for a full
    model or hub id); a missing base or a cycle is a CheckpointError naming the folder."""
    current, adapters = local_path(name_or_path), []
    while is_adapter_folder(current):
        if current in adapters or len(adapters) >= _MAX_CHAIN:
            raise CheckpointError(f"{name_or_path}: the adapters' base models form a cycle at {current}")
        adapters.append(current)
        current = _base_of(Path(current))
    return AdapterChain(base=current, adapters=tuple(reversed(adapters)))


def architecture_source(name_or_path: str | Path) -> str:
    """The folder or hub id whose ``config.json`` describes the model's architecture (the chain's base)."""
    return adapter_chain(name_or_path).base


__all__ = [
    "ADAPTER_CONFIG",
    "AdapterChain",
    "adapter_chain",
    "architecture_source",
    "is_adapter_folder",
    "local_path",
]
