"""What travels between the trainer and a rollout server: prompts, sampling parameters, trees and weights.

Every body is one ``torch.save`` of plain containers and tensors, read back with ``torch.load(weights_only=True)``
(no pickled code runs on either side). A prompt travels as the parts the vLLM engine reads: its token ids
(vision placeholders expanded, which the server checks against its own expansion), the resized image as
``uint8 [H, W, 3]`` and the record id for messages. A tree travels without its prompts; the client puts its own
back. Weights travel as ``(name, tensor)`` pairs; :func:`weights_digest` fingerprints them on both sides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams


class WireError(ValueError):
    """A body that is not what the protocol sends: names the part at fault."""


@dataclass(frozen=True)
class RecordRef:
    """The record a served prompt came from, by id (all the engine's messages need of it)."""

    id: str


@dataclass(frozen=True)
class ServedPrompt:
    """A prompt as the server's vLLM engine reads it: the parts of a :class:`PromptInputs` it uses."""

    record: RecordRef
    input_ids: torch.Tensor
    image: Image.Image | None


def dumps(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def loads(body: bytes, what: str) -> dict[str, Any]:
    """A body written by :func:`dumps`; anything else is a :class:`WireError` naming ``what``."""
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning: the error below says it all
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many kinds for a damaged or foreign body
        raise WireError(f"{what}: not a rollout-server body ({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict):
        raise WireError(f"{what}: expected a mapping, got {type(payload).__name__}")
    return payload


def required(payload: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``payload[name]``, checked to be a ``kind``."""
    if name not in payload:
        raise WireError(f"{what}: missing {name!r}")
    value = payload[name]
    if not isinstance(value, kind):
        raise WireError(f"{what}: {name!r} is {type(value).__name__}")
    return value


def encode_prompts(prompts: Sequence[PromptInputs]) -> list[dict[str, Any]]:
    return [
        {
            "record_id": p.record.id,
            "input_ids": p.input_ids,
            "image": None if p.image is None else torch.from_numpy(np.asarray(p.image.convert("RGB")).copy()),
        }
        for p in prompts
    ]


def decode_prompts(rows: Any, what: str) -> list[ServedPrompt]:
    if not isinstance(rows, list):
        raise WireError(f"{what}: 'prompts' is not a list")
    prompts = []
    for i, row in enumerate(rows):
        part = f"{what}: prompts[{i}]"
        if not isinstance(row, dict):
            raise WireError(f"{part} is not a mapping")
        ids = required(row, "input_ids", torch.Tensor, part)
        image = row.get("image")
        if ids.dim() != 1 or ids.dtype != torch.long:
            raise WireError(f"{part}: input_ids must be a 1-d long tensor")
        if image is not None and not (
            isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.dim() == 3
        ):
            raise WireError(f"{part}: image must be a uint8 [H, W, 3] tensor or None")
        prompts.append(
            ServedPrompt(
                RecordRef(str(required(row, "record_id", str, part))),
                ids,
                None if image is None else Image.fromarray(image.numpy(), "RGB"),
            )
        )
    return prompts


def encode_params(params: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(params)


def decode_params(value: Any, what: str) -> SamplingParams:
    """Sampling parameters, range-checked by their own constructor (its message names the field)."""
    if not isinstance(value, dict):
        raise WireError(f"{what}: 'params' is not a mapping")
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    if unknown := sorted(set(value) - names):
        raise WireError(f"{what}: unknown sampling parameters {unknown}")
    try:
        return SamplingParams(**value)
    except (TypeError, ValueError) as err:
        raise WireError(f"{what}: {err}") from None


_TREE_FIELDS = tuple(f.name for f in dataclasses.fields(RolloutTree) if f.name != "prompts")


def encode_tree(tree: RolloutTree) -> dict[str, Any]:
    """A tree's fields without its prompts."""
    return {name: getattr(tree, name) for name in _TREE_FIELDS}


def decode_tree(fields: Any, prompts: Sequence[Any], what: str) -> RolloutTree:
    """The tree of ``fields`` with ``prompts`` (one per row) put back."""
    if not isinstance(fields, dict) or set(fields) != set(_TREE_FIELDS):
        raise WireError(f"{what}: a tree needs exactly the fields {list(_TREE_FIELDS)}")
    tree = RolloutTree(prompts=list(prompts), **fields)
    if tree.thought_ids.shape[0] != len(prompts):
        raise WireError(f"{what}: the tree has {tree.thought_ids.shape[0]} rows for {len(prompts)} prompts")
    return tree


def encode_weights(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs, each detached, contiguous and on the CPU (what a body can hold)."""
    return [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in pairs]


def decode_weights(value: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(value, list) or not all(
        isinstance(pair, tuple)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and isinstance(pair[1], torch.Tensor)
        for pair in value
    ):
        raise WireError(f"{what}: 'weights' must be a list of (name, tensor) pairs")
    return value


def weights_digest(pairs: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over every pair's name, dtype, shape and bytes, in order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name, tensor in pairs:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
