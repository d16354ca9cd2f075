"""A model source checked before transformers reads it: ``model.name_or_path`` empty, a local folder that is not
there, a hub id that is neither cached nor reachable (one probe request, no retries), an id the hub does not
know, a damaged ``config.json`` or a truncated ``*.safetensors`` are one line naming the key or the file
(transformers, huggingface_hub and safetensors raise tracebacks, and an unreachable hub is retried for half a
minute first).

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
#: Seconds the hub probe waits for an answer (one request; transformers' own download then has its timeouts).
HUB_PROBE_TIMEOUT_S = 5.0


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

    A hub id that is not cached is probed once when online (:func:`probe_hub`), then left to transformers
    (it downloads); offline it is refused here, before any lookup."""
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
    elif not _cached(chain.base):
        if hub_offline():
            raise ConfigError(
                f"{key}: {chain.base} is neither a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE "
                "is set; download it once online, or name a local folder (a typo?)"
            )
        probe_hub(chain.base, key)
    for folder in (*(Path(a) for a in chain.adapters), *([base] if base.is_dir() else [])):
        _check_folder(folder)


def probe_hub(hub_id: str, key: str = KEY, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> None:
    """One request, no retries, before transformers' download (which retries an unreachable hub five times
    and answers a typo with a traceback): a hub that cannot be reached, or that does not know ``hub_id``, is
    one line naming the key. Any other answer is left to the download (it has the details)."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants, get_token

    url = f"{constants.ENDPOINT.rstrip('/')}/api/models/{hub_id}"
    token = get_token()  # not build_hf_headers(): it asks the hub for a registry first (a second request)
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        urllib.request.urlopen(request, timeout=timeout_s).close()
    except urllib.error.HTTPError as err:
        if err.code in (401, 404):  # the hub answers 401 for an unknown id too, unless logged in
            raise ConfigError(
                f"{key}: {hub_id}: no such model on {constants.ENDPOINT} (a typo? a private or gated model needs "
                "`hf auth login` or HF_TOKEN)"
            ) from None
    except (OSError, ValueError) as err:  # refused, unresolvable, timed out
        reason = getattr(err, "reason", err)
        raise ConfigError(
            f"{key}: {hub_id}: cannot reach {constants.ENDPOINT} ({reason}); without a network, set "
            "HF_HUB_OFFLINE=1 to use the Hugging Face cache, or name a local model folder"
        ) from None


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
