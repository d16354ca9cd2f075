"""The typed prompt inputs an adapter produces, its special tokens, and batching them (``collate``).

The adapter (:class:`~vlm_grpoma.models.qwen.QwenVLAdapter`, one class for every family) turns a
:class:`~vlm_grpoma.datasets.schema.Record` into model inputs (chat messages → processor tensors in the model's
coordinate frame) and converts answers between that frame and original-image pixels. Prompts are kept
unpadded, one per record, so the rollout and the trainer can batch them with any continuation (``collate``)
without re-running the processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlm_grpoma.answers import CoordinateFrame
from vlm_grpoma.datasets.schema import Record

if TYPE_CHECKING:
    import torch
    from PIL import Image


@dataclass
class VideoInputs:
    """A record's video as the processor saw it: the resized frames, uint8 ``[T, 3, H, W]`` (T even: qwen-vl-utils
    repeats the last frame of an odd count) and their metadata (fps, frame indices: Qwen3-VL writes timestamps
    from them), the patches ``[P, D]``, the grid ``[1, 3]`` and, for Qwen2.5-VL, seconds per temporal patch
    ``[1]`` (its mRoPE time axis)."""

    frames: torch.Tensor
    metadata: dict[str, Any]
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    second_per_grid_ts: torch.Tensor | None


@dataclass
class PromptInputs:
    """One record ready for the model.

    ``input_ids`` [L] is the rendered chat prompt (vision placeholders expanded, no padding);
    ``pixel_values`` [P, D] the patches of every image in order; ``image_grid_thw`` [n, 3] their grids;
    ``images`` the n resized RGB images the processor saw; ``frame`` maps model-frame coordinates of the
    record's target image to its original pixels; ``video`` the record's video, if it has one.
    """

    record: Record
    text: str
    images: tuple[Image.Image, ...]  # () (and no pixel_values / image_grid_thw) for a text-only record
    input_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    frame: CoordinateFrame
    video: VideoInputs | None = None
    #: with a video: the prompt before the processor expanded its placeholders (what vLLM takes); None: the
    #: runs of image placeholders in ``input_ids`` collapsed give it
    placeholder_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the rollout needs: padding, end of turn, the vision ids to suppress, and the tag encodings."""

    pad_id: int
    eos_ids: tuple[int, ...]
    image_id: int
    video_id: int
    suppress_ids: tuple[int, ...]
    think_close: tuple[int, ...]
    answer_close: tuple[int, ...]


def collate(
    prompts: Sequence[PromptInputs],
    rows: Sequence[Sequence[int]],
    prompt_of_row: Sequence[int],
    tokens: SpecialTokens,
) -> dict[str, torch.Tensor]:
    """Left-padded model inputs for token rows that each start with one prompt (by index into ``prompts``).

    Returns input_ids / attention_mask / mm_token_type_ids [R, L] and the rows' pixel_values and
    image_grid_thw concatenated in row order, as the Qwen-VL forward expects (both absent when no row's prompt
    has an image: text-only records), and likewise their videos' pixel_values_videos, video_grid_thw and
    (Qwen2.5-VL) second_per_grid_ts.
    """
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokens.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    mm_types = (ids == tokens.image_id).long() + 2 * (ids == tokens.video_id).long()
    mm_types = mm_types * mask
    batch = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": mm_types}
    visual = [prompts[p] for p in prompt_of_row if prompts[p].pixel_values is not None]
    if visual:
        batch["pixel_values"] = torch.cat([p.pixel_values for p in visual])
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in visual])
    videos = [prompts[p].video for p in prompt_of_row if prompts[p].video is not None]
    if videos:
        batch["pixel_values_videos"] = torch.cat([v.pixel_values for v in videos])
        batch["video_grid_thw"] = torch.cat([v.grid_thw for v in videos])
        if videos[0].second_per_grid_ts is not None:
            batch["second_per_grid_ts"] = torch.cat([v.second_per_grid_ts for v in videos])
    return batch


#: The vision entries a collated batch may hold, and which of them are pixels (cast to the model's dtype).
VISION_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")


def vision_inputs(batch: dict[str, torch.Tensor], device: Any, dtype: Any) -> dict[str, torch.Tensor]:
    """The batch's vision entries on ``device``, pixels in ``dtype`` (empty for text-only rows)."""
    return {
        key: batch[key].to(device, dtype) if key in PIXEL_KEYS else batch[key].to(device)
        for key in VISION_KEYS
        if key in batch
    }


def rope_positions(owner: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mRoPE position ids [3, R, L] of a collated batch: the model's own ``get_rope_index`` with every
    image and video grid the batch holds, except Qwen2/2.5-VL batches with a video, which follow the reference
    rule transformers 5 departs from (:mod:`~vlm_grpoma.models.positions`)."""
    from vlm_grpoma.models.positions import FAMILIES_WITH_VIDEO_TIME_AXIS, video_positions

    if "video_grid_thw" in batch and owner.config.model_type in FAMILIES_WITH_VIDEO_TIME_AXIS:
        return video_positions(owner.config, batch).to(batch["input_ids"].device)
    grids = {
        key: batch[key] for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if key in batch
    }
    positions, _ = owner.get_rope_index(
        input_ids=batch["input_ids"],
        mm_token_type_ids=batch["mm_token_type_ids"],
        attention_mask=batch["attention_mask"],
        **grids,
    )
    return positions


def rope_index_owner(model: torch.nn.Module) -> Any:
    """The submodule computing Qwen-VL mRoPE positions (found through PEFT / DeepSpeed wrappers)."""
    for module in model.modules():
        if hasattr(module, "get_rope_index") and not hasattr(module, "lm_head"):
            return module
    raise TypeError(f"{type(model).__name__} has no get_rope_index: not a Qwen-VL model")
