"""The Qwen-VL adapter: one implementation, parameterised by a :class:`QwenFamily` per model family.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL share the chat format, processor call and special tokens; they differ in
the coordinate frame (normalised [0, 1000] vs resized-image pixels), the vision patch size, and the model
class, which is all a ``QwenFamily`` holds. Releases of a family differ in their chat template: the adapter
reads from the rendered generation prompt whether the template opens the thought (``ThoughtFormat``).
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
from vlm_grpoma.datasets.images import TooManyFrames, load_prompt_images, load_video_frames
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record
from vlm_grpoma.models.base import PromptInputs, SpecialTokens, VideoInputs
from vlm_grpoma.models.families import QwenFamily
from vlm_grpoma.models.prompts import (
    ANSWER_CLOSE,
    OPENED_GENERATION_SUFFIX,
    PromptText,
    ThoughtFormat,
    opens_thought,
    task_instruction,
)

if TYPE_CHECKING:
    import torch
    from PIL import Image

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
THINKING_MODES = ("auto", "opened", "closed")


def generation_prompt(processor: Any) -> str:
    """What the chat template appends for ``add_generation_prompt=True`` (rendered on a one-message probe)."""
    probe = [{"role": "user", "content": [{"type": "text", "text": "probe"}]}]
    without = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    with_prompt = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if not with_prompt.startswith(without):
        raise ValueError(
            "the chat template renders a conversation differently with add_generation_prompt=True; "
            "cannot tell what it asks the model to write (set model.thinking to opened or closed)"
        )
    return with_prompt[len(without) :]


def special_tokens(tokenizer: Any, thought: ThoughtFormat) -> SpecialTokens:
    """The rollout's token ids, read from the tokenizer (tags by their canonical encoding; the closing of a
    thought as this release writes it)."""

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
        think_close=encode(thought.close),
        answer_close=encode(ANSWER_CLOSE),
    )


def _as_pixels(frames: Any) -> Any:
    """Resized frames as uint8 pixels: qwen-vl-utils' bicubic resize leaves fractional values, which no other
    backend can be sent, so the trainer too sees the frames rounded (as it sees images: PIL pixels)."""
    import torch

    return frames.round().clamp(0, 255).to(torch.uint8)


def _video_inputs(video: tuple[Any, dict[str, Any]], encoded: Any) -> VideoInputs:
    """The one video of a prompt as qwen-vl-utils resized it and the processor encoded it (Qwen2.5-VL's seconds
    per temporal patch come as a list or a tensor: kept as a float tensor)."""
    import torch

    seconds = encoded.get("second_per_grid_ts")
    return VideoInputs(
        frames=video[0],
        metadata=dict(video[1]),
        pixel_values=encoded["pixel_values_videos"],
        grid_thw=encoded["video_grid_thw"],
        second_per_grid_ts=None
        if seconds is None
        else torch.as_tensor(seconds, dtype=torch.float32).reshape(-1),
    )


def _rounded(direction: Vec3) -> Vec3:
    return tuple(round(v, 3) for v in direction)  # type: ignore[return-value]


class QwenVLAdapter:
    """Adapter for one Qwen-VL family around a loaded processor: prompts in, answers between the family's
    coordinate frame and original pixels out. The one adapter class: every seam is typed with it."""

    def __init__(
        self,
        family: QwenFamily,
        processor: Any,
        min_pixels: int,
        max_pixels: int,
        prompt_style: str = "full",
        thinking: str = "auto",
        max_images: int = 1,
        max_video_frames: int = 0,
    ) -> None:
        """``thinking``: ``auto`` follows the chat template (a generation prompt ending in ``<think>`` opens the
        thought); ``opened`` / ``closed`` make the prompt open the thought or leave it to the model whatever
        the template does. ``max_images``: the most images one prompt may show (``model.max_images``);
        ``max_video_frames``: the most frames its video may give (``model.max_video_frames``, 0: no videos)."""
        if min_pixels > max_pixels:
            raise ValueError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels})")
        if thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {', '.join(THINKING_MODES)}, got {thinking!r}")
        self.family = family
        self.model_type = family.model_type
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.tokenizer.padding_side = "left"
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.max_images = max_images
        self.max_video_frames = max_video_frames
        self.prompt_style = prompt_style
        self.template_opens_thought = opens_thought(generation_prompt(processor))
        opened = self.template_opens_thought if thinking == "auto" else thinking == "opened"
        self.thought = ThoughtFormat(opened)
        self.tokens = special_tokens(self.tokenizer, self.thought)
        #: the user's prompt template and system prompt (``data.prompt_template``, ``data.system_prompt``)
        self.prompt_text = PromptText()

    # -- frames --------------------------------------------------------------------------------------------

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image the processor sees: qwen-vl-utils' ``smart_resize`` with our bounds."""
        from qwen_vl_utils import smart_resize

        h, w = smart_resize(
            height, width, factor=self.family.factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        return w, h

    def frame(self, record: Record) -> CoordinateFrame:
        if record.image is None:  # text-only: answers have no coordinates, the identity frame
            return CoordinateFrame.resized(1, 1, 1, 1)
        if self.family.frame_spec.extent is not None:
            return CoordinateFrame.normalised(record.width, record.height, self.family.frame_spec.extent)
        return CoordinateFrame.resized(
            record.width, record.height, *self.resized_size(record.width, record.height)
        )

    # -- prompts -------------------------------------------------------------------------------------------

    def messages(
        self,
        record: Record,
        images: Sequence[Image.Image] | None = None,
        frames: Sequence[Image.Image] | None = None,
    ) -> list[dict[str, Any]]:
        """The chat: the record's video (its ``frames``), its images in order (both loaded unless given), then
        the instruction."""
        frame = self.frame(record)
        text = task_instruction(
            record,
            self.family.frame_spec,
            round(frame.model_width),
            round(frame.model_height),
            self.prompt_style,
            self.prompt_text.templates.get(record.task),
        )
        if images is None:
            images = load_prompt_images(record)
        bounds = {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}
        visual = [{"type": "image", "image": image, **bounds} for image in images]
        if record.video is not None:
            frames = load_video_frames(record) if frames is None else frames
            fps = record.video.fps  # qwen-vl-utils reads a frame list's rate as sample_fps (raw: the same)
            visual.insert(
                0, {"type": "video", "video": list(frames), "sample_fps": fps, "raw_fps": fps, **bounds}
            )
        user = {"role": "user", "content": [*visual, {"type": "text", "text": text}]}
        if self.prompt_style == "compact":
            return [user]
        system_text = self.prompt_text.system or self.thought.system_prompt
        system = {"role": "system", "content": [{"type": "text", "text": system_text}]}
        return [system, user]

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat template's text for ``messages`` plus the generation prompt, with the thought opened by
        the prompt exactly when :attr:`thought` says so (appending or dropping the template's ``<think>``)."""
        visuals = sum(item.get("type") in ("image", "video") for m in messages for item in m["content"])
        text = self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, add_vision_id=visuals > 1
        )
        if self.thought.opened and not self.template_opens_thought:
            return text + OPENED_GENERATION_SUFFIX
        if self.template_opens_thought and not self.thought.opened:
            return text[: text.rstrip().rfind(OPENED_GENERATION_SUFFIX.strip())]
        return text

    def build_inputs(
        self, records: Sequence[Record], images: Sequence[Sequence[Image.Image]] | None = None
    ) -> list[PromptInputs]:
        """Each record's prompt tensors; ``images`` gives each record's prompt images (loaded otherwise)."""
        from qwen_vl_utils import process_vision_info

        if images is None:
            images = [load_prompt_images(r) for r in records]
        out = []
        for record, shown in zip(records, images, strict=True):
            if len(shown) != len(record.prompt_images):
                raise ValueError(f"record {record.id}: {len(shown)} images for {len(record.prompt_images)}")
            if len(shown) > self.max_images:
                raise ValueError(
                    f"record {record.id}: {len(shown)} images, more than model.max_images={self.max_images}"
                )
            messages = self.messages(record, shown, self._video_frames(record))
            text = self.render(messages)
            if record.text_only:
                ids = self.processor(text=[text], return_tensors="pt")["input_ids"][0]
                out.append(PromptInputs(record, text, (), ids, None, None, self.frame(record)))
                continue
            vision, videos, _ = process_vision_info(
                messages,
                return_video_kwargs=True,
                return_video_metadata=True,
                image_patch_size=self.family.patch_size,
            )
            if shown:
                self._check_target(record, shown, vision)
            video = None if not videos else (_as_pixels(videos[0][0]), dict(videos[0][1]))
            enc = self.processor(
                text=[text],
                images=vision,
                videos=None if video is None else [video[0]],
                video_metadata=None if video is None else [video[1]],
                do_resize=False,
                do_sample_frames=False,
                return_tensors="pt",
            )
            out.append(
                PromptInputs(
                    record=record,
                    text=text,
                    images=tuple(vision or ()),
                    input_ids=enc["input_ids"][0],
                    pixel_values=enc.get("pixel_values"),
                    image_grid_thw=enc.get("image_grid_thw"),
                    frame=self.frame(record),
                    video=None if video is None else _video_inputs(video, enc),
                    placeholder_ids=None if video is None else self._placeholder_ids(text),
                )
            )
        return out

    def _video_frames(self, record: Record) -> list[Image.Image] | None:
        """The record's video frames, at most ``model.max_video_frames`` of them (ValueError beyond)."""
        if record.video is None:
            return None
        limit, count = self.max_video_frames, len(record.video.frames)
        if count > limit or not limit:
            given = f"a video of {count} frames" if count else f"a video ({record.video.path})"
            raise ValueError(
                f"record {record.id}: {given}, more than model.max_video_frames={limit}; set it to at least "
                f"{count or 'the frames it gives at its fps'}"
            )
        try:
            return load_video_frames(record, limit)
        except TooManyFrames as err:
            raise ValueError(f"{err} (model.max_video_frames)") from None

    def _placeholder_ids(self, text: str) -> torch.Tensor:
        """The rendered prompt's tokens with one placeholder per image and video, before the processor expands
        them: what vLLM expands itself (a video's expansion interleaves Qwen3-VL's timestamps, so collapsing
        runs of placeholders cannot recover it)."""
        import torch

        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def _check_target(
        self, record: Record, shown: Sequence[Image.Image], resized: Sequence[Image.Image]
    ) -> None:
        """The target image must be the record's size and resize as the coordinate frame assumes."""
        target, expected = shown[record.target_image], self.resized_size(record.width, record.height)
        if target.size != (record.width, record.height) or resized[record.target_image].size != expected:
            raise ValueError(
                f"record {record.id}: image is {target.size[0]}x{target.size[1]}, resized to "
                f"{resized[record.target_image].size}, but the record says {record.width}x{record.height} "
                f"(resized {expected})"
            )

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
