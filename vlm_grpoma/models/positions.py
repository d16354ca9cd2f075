"""mRoPE positions of Qwen2-VL and Qwen2.5-VL prompts with a video, as the released models were trained.

After an image or a video the text continues at the largest position the vision tokens took, plus one, on all
three axes (Qwen2.5-VL's reference ``get_rope_index``, and vLLM's ``get_mrope_input_positions``). transformers 5
continues instead at the start plus the larger spatial side, which is the same for images (one frame) but not
for a video whose time axis reaches further: on Qwen2.5-VL each temporal patch is ``tokens_per_second *
second_per_grid_ts`` positions apart (25 at 2 frames a second), so every token after a video got positions the
model never saw in training and vLLM never uses (measured: log-probs 0.008 nats off the vLLM rollout's on the
tiny model). :func:`video_positions` is the reference rule; :func:`~vlm_grpoma.models.base.rope_positions` uses
it for these families' batches with a video and the model's own ``get_rope_index`` for everything else.
Qwen3-VL encodes each frame as its own one-frame grid behind a timestamp, so it is not affected.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

#: The families whose video positions follow the reference rule here (their model_type).
FAMILIES_WITH_VIDEO_TIME_AXIS = ("qwen2_vl", "qwen2_5_vl")


def video_positions(config: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Position ids ``[3, R, L]`` of a collated batch (left padding at 0): text one step per token, an image
    or video grid ``t x h x w`` (merged) at ``start + (t_index * step, h_index, w_index)``, the next segment
    one past the largest position so far."""
    merge = config.vision_config.spatial_merge_size
    tokens_per_second = getattr(config.vision_config, "tokens_per_second", 1.0)
    ids, types, mask = batch["input_ids"], batch["mm_token_type_ids"], batch["attention_mask"].bool()
    grids = {
        1: iter(batch.get("image_grid_thw", torch.empty(0, 3)).tolist()),
        2: iter(batch.get("video_grid_thw", torch.empty(0, 3)).tolist()),
    }
    seconds = iter(batch["second_per_grid_ts"].tolist()) if "second_per_grid_ts" in batch else None
    positions = torch.zeros((3, *ids.shape), dtype=torch.long)
    for row in range(ids.shape[0]):
        kinds = types[row][mask[row]].tolist()
        parts, start = [], 0
        for kind, run in itertools.groupby(kinds):
            length = len(list(run))
            if kind == 0:
                parts.append(torch.arange(length).expand(3, -1) + start)
            else:
                t, h, w = next(grids[kind])
                step = tokens_per_second * next(seconds) if kind == 2 and seconds is not None else 1.0
                grid = torch.stack(
                    torch.meshgrid(
                        (torch.arange(t) * step).long(),
                        torch.arange(h // merge),
                        torch.arange(w // merge),
                        indexing="ij",
                    )
                ).reshape(3, -1)
                if grid.shape[1] != length:
                    raise ValueError(
                        f"row {row}: {length} vision tokens for a {t}x{h}x{w} grid (merge {merge}): "
                        "image features and image tokens do not match"
                    )
                parts.append(grid + start)
            start = int(parts[-1].max()) + 1
        positions[:, row, mask[row]] = torch.cat(parts, dim=1)
    return positions


__all__ = ["FAMILIES_WITH_VIDEO_TIME_AXIS", "video_positions"]
