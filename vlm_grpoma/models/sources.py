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


def looks_like_hub_id(text: str) -> bool:
    """``org/name`` as the Hugging Face hub spells ids (not a path: no leading ``.`` or ``/``, one slash)."""
    return bool(_HUB_ID.fullmatch(text)) and not text.startswith((".", "/"))


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
    beside = adapter / base  # a relative base: from the adapter folder (what a checkpoint records)
    if not os.path.isabs(base) and beside.is_dir():
        return str(beside.resolve())
    if os.path.isdir(base):
        return local_path(base)
    if looks_like_hub_id(base):
        return base
    raise CheckpointError(
        f"{adapter}: is a LoRA adapter whose base model {base!r} (base_model_name_or_path in "
        f"{ADAPTER_CONFIG}) is not found; put that folder back, edit the path to where it now is, or "
        "name the base with export --base"
    )


@dataclass(frozen=True)
class AdapterChain:
    """A model folder resolved to its full base model and the adapters to apply to it, base first."""

    base: str
    adapters: tuple[str, ...]

    @property
    def is_adapter(self) -> bool:
        return bool(self.adapters)


def adapter_chain(name_or_path: str | Path, base: str | None = None) -> AdapterChain:
    """The full model at the bottom of ``name_or_path`` and the adapter folders above it (none for a full
    model or hub id); a missing base or a cycle is a CheckpointError naming the folder.

    ``base`` overrides the full model the chain rests on (an adapter trained on another machine, whose
    recorded base is not here): the first adapter above a full model takes it instead of its recorded base.
    """
    current, adapters = local_path(name_or_path), []
    while is_adapter_folder(current):
        if current in adapters or len(adapters) >= _MAX_CHAIN:
            raise CheckpointError(f"{name_or_path}: the adapters' base models form a cycle at {current}")
        adapters.append(current)
        if base is not None and not _recorded_base_is_adapter(Path(current)):
            return AdapterChain(base=local_path(base), adapters=tuple(reversed(adapters)))
        current = _base_of(Path(current))
    return AdapterChain(base=current, adapters=tuple(reversed(adapters)))


def _recorded_base_is_adapter(adapter: Path) -> bool:
    try:
        return is_adapter_folder(_base_of(adapter))
    except CheckpointError:  # not found here: the override takes its place
        return False


def portable_base(base: str, adapter_dir: str | Path) -> str:
    """What an adapter saved into ``adapter_dir`` records as its base: a hub id unchanged, a local folder as a
    path relative to the adapter (it moves with the run, and names no folder of the training machine)."""
    if not os.path.isdir(base):
        return base
    return os.path.relpath(os.path.abspath(base), os.path.abspath(adapter_dir))


def record_portable_base(adapter_dir: str | Path) -> None:
    """Rewrite a just-saved adapter's ``base_model_name_or_path`` with :func:`portable_base`."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = portable_base(config["base_model_name_or_path"], adapter_dir)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


__all__ = [
    "ADAPTER_CONFIG",
    "AdapterChain",
    "adapter_chain",
    "is_adapter_folder",
    "local_path",
    "looks_like_hub_id",
    "portable_base",
    "record_portable_base",
]
