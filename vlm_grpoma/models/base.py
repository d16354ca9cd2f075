"""The model-adapter protocol and the typed prompt inputs it produces.

An adapter turns a :class:`~vlm_grpoma.datasets.schema.Record` into model inputs (chat messages → processor
tensors in the model's coordinate frame) and converts answers between that frame and original-image pixels.
Prompts are kept unpadded, one per record, so the rollout and the trainer can batch them with any
continuation (``collate``) without re-running the processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vlm_grpoma.answers import Answer, CoordinateFrame, ParseError
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.models.prompts import ThoughtFormat

if TYPE_CHECKING:
    import torch
    from PIL import Image


@dataclass
class PromptInputs:
    """One record ready for the model.

    ``input_ids`` [L] is the rendered chat prompt (vision placeholders expanded, no padding);
    ``pixel_values`` [P, D] the image patches; ``image_grid_thw`` [1, 3] their grid; ``image`` the resized
    RGB image the processor saw; ``frame`` maps model-frame coordinates to original pixels.
    """

    record: Record
    text: str
    image: Image.Image
    input_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    frame: CoordinateFrame


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


class ModelAdapter(Protocol):
    """What every model family provides: build inputs, parse and format answers, coordinate frames."""

    model_type: str
    processor: Any
    tokens: SpecialTokens
    #: whether the prompt opens the thought, and so what a completion looks like
    thought: ThoughtFormat

    def messages(self, record: Record, image: Image.Image | None = None) -> list[dict[str, Any]]:
        """Chat messages (system + user with image and task instruction) for a record."""
        ...

    def frame(self, record: Record) -> CoordinateFrame:
        """The map between this family's coordinate frame and the record's original pixels."""
        ...

    def build_inputs(
        self, records: Sequence[Record], images: Sequence[Image.Image] | None = None
    ) -> list[PromptInputs]:
        """Render, process and tokenise records (images loaded from ``record.image`` unless given)."""
        ...

    def parse_answer(self, text: str, record: Record) -> Answer | ParseError:
        """A completion's answer in ORIGINAL pixels, or why it is not one; never raises."""
        ...

    def format_answer(self, answer: Answer, record: Record) -> str:
        """An answer in original pixels written as this family's model-frame JSON (SFT targets)."""
        ...


def collate(
    prompts: Sequence[PromptInputs],
    rows: Sequence[Sequence[int]],
    prompt_of_row: Sequence[int],
    tokens: SpecialTokens,
) -> dict[str, torch.Tensor]:
    """Left-padded model inputs for token rows that each start with one prompt (by index into ``prompts``).

    Returns input_ids / attention_mask / mm_token_type_ids [R, L] and the rows' pixel_values and
    image_grid_thw concatenated in row order, as the Qwen-VL forward expects.
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
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": mm_types,
        "pixel_values": torch.cat([prompts[p].pixel_values for p in prompt_of_row]),
        "image_grid_thw": torch.cat([prompts[p].image_grid_thw for p in prompt_of_row]),
    }


def rope_index_owner(model: torch.nn.Module) -> Any:
    """The submodule computing Qwen-VL mRoPE positions (found through PEFT / DeepSpeed wrappers)."""
    for module in model.modules():
        if hasattr(module, "get_rope_index") and not hasattr(module, "lm_head"):
            return module
    raise TypeError(f"{type(model).__name__} has no get_rope_index: not a Qwen-VL model")
