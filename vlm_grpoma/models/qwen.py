"""The Qwen-VL adapter: one implementation, parameterised by a :class:`QwenFamily` per model family.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL share the chat format, processor call and special tokens; they differ in
the coordinate frame (normalised [0, 1000] vs resized-image pixels), the vision patch size, and the model
class, which is all a ``QwenFamily`` holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vlm_grpoma.answers import (
    Answer,
    ContactAction,
    CoordinateFrame,
    ParseError,
    Vec3,
    format_answer,
    map_xy,
    parse_answer,
)
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record
from vlm_grpoma.models.base import PromptInputs, SpecialTokens
from vlm_grpoma.models.families import QwenFamily
from vlm_grpoma.models.prompts import ANSWER_CLOSE, SYSTEM_PROMPT, THINK_CLOSE, task_instruction

if TYPE_CHECKING:
    from PIL import Image

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def special_tokens(tokenizer: Any) -> SpecialTokens:
    """The rollout's token ids, read from the tokenizer (tags by their canonical encoding)."""

    def single(token: str) -> int:
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"the tokenizer has no {token} token; is this a Qwen-VL processor?")
        return tid

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    eos = {single("<|im_end|>"), single("<|endoftext|>")}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else single("<|endoftext|>")
    return SpecialTokens(
        pad_id=pad,
        eos_ids=tuple(sorted(eos)),
        image_id=single("<|image_pad|>"),
        video_id=single("<|video_pad|>"),
        suppress_ids=tuple(single(t) for t in VISION_TOKENS),
        think_close=encode(THINK_CLOSE),
        answer_close=encode(ANSWER_CLOSE),
    )


def _rounded(direction: Vec3) -> Vec3:
    return tuple(round(v, 3) for v in direction)  # type: ignore[return-value]


class QwenVLAdapter:
    """Adapter for one Qwen-VL family around a loaded processor (see :class:`~vlm_grpoma.models.base.ModelAdapter`)."""

    def __init__(
        self, family: QwenFamily, processor: Any, min_pixels: int, max_pixels: int, prompt_style: str = "full"
    ) -> None:
        if min_pixels > max_pixels:
            raise ValueError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels})")
        self.family = family
        self.model_type = family.model_type
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.tokenizer.padding_side = "left"
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.prompt_style = prompt_style
        self.tokens = special_tokens(self.tokenizer)

    # -- frames --------------------------------------------------------------------------------------------

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image the processor sees: qwen-vl-utils' ``smart_resize`` with our bounds."""
        from qwen_vl_utils import smart_resize

        h, w = smart_resize(
            height, width, factor=self.family.factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        return w, h

    def frame(self, record: Record) -> CoordinateFrame:
        if self.family.frame_spec.extent is not None:
            return CoordinateFrame.normalised(record.width, record.height, self.family.frame_spec.extent)
        return CoordinateFrame.resized(
            record.width, record.height, *self.resized_size(record.width, record.height)
        )

    # -- prompts -------------------------------------------------------------------------------------------

    def messages(self, record: Record, image: Image.Image | None = None) -> list[dict[str, Any]]:
        frame = self.frame(record)
        text = task_instruction(
            record,
            self.family.frame_spec,
            round(frame.model_width),
            round(frame.model_height),
            self.prompt_style,
        )
        visual: dict[str, Any] = {
            "type": "image",
            "image": image if image is not None else load_image(record),
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }
        user = {"role": "user", "content": [visual, {"type": "text", "text": text}]}
        if self.prompt_style == "compact":
            return [user]
        return [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}, user]

    def build_inputs(
        self, records: Sequence[Record], images: Sequence[Image.Image] | None = None
    ) -> list[PromptInputs]:
        from qwen_vl_utils import process_vision_info

        if images is None:
            images = [load_image(r) for r in records]
        out = []
        for record, image in zip(records, images, strict=True):
            messages = self.messages(record, image)
            text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            vision, _ = process_vision_info(messages, image_patch_size=self.family.patch_size)
            expected = self.resized_size(record.width, record.height)
            if image.size != (record.width, record.height) or vision[0].size != expected:
                raise ValueError(
                    f"record {record.id}: image is {image.size[0]}x{image.size[1]}, resized to "
                    f"{vision[0].size}, but the record says {record.width}x{record.height} "
                    f"(resized {expected})"
                )
            enc = self.processor(text=[text], images=vision, do_resize=False, return_tensors="pt")
            out.append(
                PromptInputs(
                    record=record,
                    text=text,
                    image=vision[0],
                    input_ids=enc["input_ids"][0],
                    pixel_values=enc["pixel_values"],
                    image_grid_thw=enc["image_grid_thw"],
                    frame=self.frame(record),
                )
            )
        return out

    # -- answers -------------------------------------------------------------------------------------------

    def parse_answer(self, text: str, record: Record) -> Answer | ParseError:
        frame = self.frame(record)
        parsed = parse_answer(
            text, ANSWER_KIND_OF_TASK[record.task], bounds=(frame.model_width, frame.model_height)
        )
        return parsed if isinstance(parsed, ParseError) else frame.to_pixels(parsed)

    def format_answer(self, answer: Answer, record: Record) -> str:
        """Model-frame JSON: integer coordinates, unit directions to 3 decimals (short, learnable targets)."""
        model = map_xy(self.frame(record).from_pixels(answer), lambda x, y: (int(round(x)), int(round(y))))
        if isinstance(model, ContactAction):
            model = replace(model, up=_rounded(model.up), forward=_rounded(model.forward))
        return format_answer(model)
