"""The Qwen-VL families the suite supports, as data: config ``model_type``, vision patch size, coordinate frame.

Cheap to import (no torch, no transformers), so the CLI and config validation can list the families.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlm_grpoma.models.prompts import FrameSpec

SPATIAL_MERGE = 2


@dataclass(frozen=True)
class QwenFamily:
    """What distinguishes one Qwen-VL family: its config ``model_type``, patch size and coordinate frame."""

    model_type: str
    patch_size: int
    frame_spec: FrameSpec

    @property
    def factor(self) -> int:
        """Image sides are multiples of this many pixels (one merged vision token)."""
        return self.patch_size * SPATIAL_MERGE


FAMILIES: dict[str, QwenFamily] = {
    "qwen2_vl": QwenFamily("qwen2_vl", 14, FrameSpec(1000)),
    "qwen2_5_vl": QwenFamily("qwen2_5_vl", 14, FrameSpec(None)),
    "qwen3_vl": QwenFamily("qwen3_vl", 16, FrameSpec(1000)),
}

#: Every supported ``model_type`` (``make-tiny-model --arch`` choices).
ARCHS: tuple[str, ...] = tuple(FAMILIES)
