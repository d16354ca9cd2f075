"""A model source checked before transformers reads it: ``model.name_or_path`` empty, a local folder that is not
there, a hub id that is neither cached nor reachable, a damaged ``config.json`` or a truncated ``*.safetensors``
are one line naming the key or the file (transformers, huggingface_hub and safetensors raise tracebacks, and an
offline hub lookup retries for half a minute first).

The checks read only what is cheap: ``config.json`` and each safetensors file's header and size, never weights.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vlm_grpoma.errors import CheckpointError, ConfigError
from vlm_grpoma.models.sources import adapter_chain, looks_like_hub_id

KEY = "model.name_or_path"
#: The safetensors header: an 8-byte little-endian length, then that many bytes of JSON.
_HEADER_LENGTH_BYTES = 8
#: No real header is larger (transformers' biggest shards carry ~1 MB); beyond it the file is not safetensors.
_MAX_HEADER_BYTES = 100 << 20


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set: the cache only, no network."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("TRANSFORMERS_OFFLINE", "").upper() in {
        "1",
        "ON",
        "YES",
        "TRUE",
    }


def _cached(hub_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def check_safetensors(path: Path) -> None:
    """A safetensors file whose header parses and whose size is what the header says (a truncated or
    overwritten file is a CheckpointError naming it)."""
    size = path.stat().st_size
    problem = None
    with open(path, "rb") as f:
        head = f.read(_HEADER_LENGTH_BYTES)
        if len(head) < _HEADER_LENGTH_BYTES:
            problem = f"{size} bytes, too short for a safetensors header"
        else:
            (length,) = struct.unpack("<Q", head)
            if length > min(size - _HEADER_LENGTH_BYTES, _MAX_HEADER_BYTES):
                problem = f"its header claims {length} bytes of a {size}-byte file"
            else:
                try:
                    header = json.loads(f.read(length))
                    ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
                except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                    header, ends = None, []
                    problem = "its header is not valid safetensors JSON"
                if header is not None and _HEADER_LENGTH_BYTES + length + max(ends, default=0) != size:
                    problem = f"{size} bytes, its header describes {_HEADER_LENGTH_BYTES + length + max(ends, default=0)}"
    if problem:
        raise CheckpointError(f"{path}: damaged or truncated ({problem}); copy the model folder again")


def _check_folder(folder: Path) -> None:
    """A local model or adapter folder's config JSON and safetensors files."""
    for name in ("config.json", "adapter_config.json"):
        config = folder / name
        if config.is_file():
            try:
                json.loads(config.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise CheckpointError(
                    f"{config}: not valid JSON ({err}); the model folder is damaged"
                ) from None
    for weights in sorted(folder.glob("*.safetensors")):
        check_safetensors(weights)


def check_model_source(name_or_path: str, key: str = KEY) -> None:
    """Refuse with one line what ``from_pretrained`` would fail on with a traceback (see the module doc).

    A hub id that is not cached is left to transformers when online (it downloads); offline it is refused
    here, before any lookup."""
    if not name_or_path or not name_or_path.strip():
        raise ConfigError(f"{key}: empty; name a Hugging Face checkpoint (org/name) or a local model folder")
    chain = adapter_chain(name_or_path)
    base = Path(chain.base)
    if base.is_dir():
        if not (base / "config.json").is_file():
            raise ConfigError(
                f"{key}: {base} has no config.json: not a model folder (a run's model is in "
                "checkpoints/step-N/model)"
            )
    elif not looks_like_hub_id(chain.base):
        raise ConfigError(f"{key}: {chain.base}: no such folder (and not a hub id of the form org/name)")
    elif hub_offline() and not _cached(chain.base):
        raise ConfigError(
            f"{key}: {chain.base} is neither a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE "
            "is set; download it once online, or name a local folder (a typo?)"
        )
    for folder in (*(Path(a) for a in chain.adapters), *([base] if base.is_dir() else [])):
        _check_folder(folder)


@contextmanager
def model_load_errors(name_or_path: str, key: str = KEY) -> Iterator[None]:
    """What is left after :func:`check_model_source`: a hub that cannot be reached or refuses the id, or a file
    transformers cannot read, becomes one line naming the key and the first line of the library's message."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as err:  # huggingface_hub's errors are OSErrors
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        offline = "" if hub_offline() else "; offline, set HF_HUB_OFFLINE=1 to use the cache without retries"
        raise ConfigError(f"{key}: {name_or_path}: cannot be loaded: {detail}{offline}") from None
