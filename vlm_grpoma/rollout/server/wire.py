"""What travels between the trainer and a rollout server: prompts, sampling parameters, trees and weights.

Every body is one ``torch.save`` of plain containers and tensors, read back with ``torch.load(weights_only=True)``
(no pickled code runs on either side). A prompt travels as the parts the vLLM engine reads: its token ids
(vision placeholders expanded, which the server checks against its own expansion), the resized images in
prompt order, each as ``uint8 [H, W, 3]``, a video as its frames ``uint8 [T, 3, H, W]``, their metadata and the
prompt before expansion, and the record id for messages. A tree travels without its prompts; the client puts its own
back. Weights travel as ``(name, tensor)`` pairs; :func:`weights_digest` fingerprints them on both sides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import warnings
import zipfile
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
    images: tuple[Image.Image, ...]
    video: VideoFrames | None = None
    placeholder_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class VideoFrames:
    """A served prompt's video: what the vLLM request reads of a :class:`~vlm_grpoma.models.base.VideoInputs`."""

    frames: torch.Tensor  # uint8 [T, 3, H, W]
    metadata: dict[str, Any]


def dumps(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _check_archive(body: bytes, what: str) -> None:
    """``torch.save`` stores its entries uncompressed: a compressed entry (a zip bomb's way to grow) or entries
    larger in sum than the body are refused before anything is unpacked."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return  # not an archive at all: torch.load names it below
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries):
        raise WireError(f"{what}: not a rollout-server body (a compressed entry)")
    if sum(e.file_size for e in entries) > len(body):
        raise WireError(f"{what}: not a rollout-server body (entries larger than the body)")


def _check_tensors(value: Any, what: str, depth: int = 0) -> None:
    """Every tensor a body holds is dense and backed by its own bytes: a stride-0 view of one element that
    claims billions would be allocated in full by the first copy."""
    if depth > 32:
        raise WireError(f"{what}: nested deeper than 32 levels")
    if isinstance(value, torch.Tensor):
        if not value.is_contiguous() or (
            value.numel() and value.untyped_storage().nbytes() < value.numel() * value.element_size()
        ):
            raise WireError(f"{what}: a tensor of shape {tuple(value.shape)} that its data does not fill")
    elif isinstance(value, dict):
        for item in value.values():
            _check_tensors(item, what, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_tensors(item, what, depth + 1)


def loads(body: bytes, what: str) -> dict[str, Any]:
    """A body written by :func:`dumps`; anything else is a :class:`WireError` naming ``what``."""
    _check_archive(body, what)
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning: the error below says it all
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many kinds for a damaged or foreign body
        raise WireError(f"{what}: not a rollout-server body ({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict):
        raise WireError(f"{what}: expected a mapping, got {type(payload).__name__}")
    _check_tensors(payload, what)
    return payload


def required(payload: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``payload[name]``, checked to be a ``kind`` (a bool is not an int here)."""
    if name not in payload:
        raise WireError(f"{what}: missing {name!r}")
    value = payload[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise WireError(f"{what}: {name!r} is {type(value).__name__}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def encode_prompts(prompts: Sequence[PromptInputs]) -> list[dict[str, Any]]:
    return [
        {
            "record_id": p.record.id,
            "input_ids": p.input_ids,
            "images": [torch.from_numpy(np.asarray(image.convert("RGB")).copy()) for image in p.images],
            **({} if p.video is None else _encode_video(p)),
        }
        for p in prompts
    ]


def _encode_video(prompt: PromptInputs) -> dict[str, Any]:
    meta = prompt.video.metadata
    return {
        "video": prompt.video.frames,
        "video_fps": float(meta["fps"]),
        "video_frame_indices": torch.tensor(meta["frames_indices"], dtype=torch.long),
        "video_total_frames": float(meta["total_num_frames"]),
        "placeholder_ids": prompt.placeholder_ids,
    }


def _decode_video(row: dict, part: str) -> tuple[VideoFrames | None, torch.Tensor | None]:
    """A row's video (frames, metadata) and prompt before expansion; both absent without a video."""
    if "video" not in row:
        return None, None
    frames = required(row, "video", torch.Tensor, part)
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[1] != 3 or len(frames) < 2:
        raise WireError(f"{part}: video must be a uint8 [T, 3, H, W] tensor of at least 2 frames")
    indices = required(row, "video_frame_indices", torch.Tensor, part)
    if indices.dtype != torch.long or indices.shape != (len(frames),):
        raise WireError(f"{part}: video_frame_indices must be a long tensor, one index per frame")
    fps = required(row, "video_fps", float, part)
    total = required(row, "video_total_frames", float, part)
    if not (math.isfinite(fps) and fps > 0 and math.isfinite(total) and total > 0):
        raise WireError(f"{part}: video_fps and video_total_frames must be positive and finite")
    ids = required(row, "placeholder_ids", torch.Tensor, part)
    if ids.dim() != 1 or ids.dtype != torch.long:
        raise WireError(f"{part}: placeholder_ids must be a 1-d long tensor")
    metadata = {"fps": fps, "frames_indices": indices.tolist(), "total_num_frames": total}
    return VideoFrames(frames, metadata), ids


def decode_prompts(rows: Any, what: str) -> list[ServedPrompt]:
    if not isinstance(rows, list):
        raise WireError(f"{what}: 'prompts' is not a list")
    prompts = []
    for i, row in enumerate(rows):
        part = f"{what}: prompts[{i}]"
        if not isinstance(row, dict):
            raise WireError(f"{part} is not a mapping")
        ids = required(row, "input_ids", torch.Tensor, part)
        images = required(row, "images", list, part)
        if ids.dim() != 1 or ids.dtype != torch.long:
            raise WireError(f"{part}: input_ids must be a 1-d long tensor")
        for j, image in enumerate(images):
            if not (
                isinstance(image, torch.Tensor)
                and image.dtype == torch.uint8
                and image.dim() == 3
                and image.shape[-1] == 3
            ):
                raise WireError(f"{part}: images[{j}] must be a uint8 [H, W, 3] tensor")
        video, placeholder_ids = _decode_video(row, part)
        prompts.append(
            ServedPrompt(
                RecordRef(str(required(row, "record_id", str, part))),
                ids,
                tuple(Image.fromarray(image.numpy(), "RGB") for image in images),
                video,
                placeholder_ids,
            )
        )
    return prompts


def encode_params(params: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(params)


def decode_params(value: Any, what: str) -> SamplingParams:
    """Sampling parameters, range-checked by their own constructor (its message names the field)."""
    if not isinstance(value, dict):
        raise WireError(f"{what}: 'params' is not a mapping")
    fields = {f.name: f.type for f in dataclasses.fields(SamplingParams)}
    if unknown := sorted(set(value) - set(fields)):
        raise WireError(f"{what}: unknown sampling parameters {unknown}")
    for name, given in value.items():
        if not _of_type(given, str(fields[name])):
            raise WireError(f"{what}: params.{name} must be {fields[name]}, got {given!r}")
    try:
        return SamplingParams(**value)
    except (TypeError, ValueError) as err:
        raise WireError(f"{what}: {err}") from None


def _of_type(value: Any, annotation: str) -> bool:
    """``value`` fits a SamplingParams annotation: ints are ints (not bools), floats finite numbers."""
    if value is None:
        return "None" in annotation
    if annotation.startswith("bool"):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if annotation.startswith("int"):
        return isinstance(value, int)
    if annotation.startswith("float"):
        return isinstance(value, int | float) and math.isfinite(value)
    return True


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
