"""Records this model cannot take, found when they are loaded rather than when first sampled: a prompt holding
one of the tokenizer's special tokens (chat control ``<|im_end|>``, vision placeholders ``<|image_pad|>``: they
would restructure the conversation or break the image-token count, so they are refused, not escaped — an
escape would change the prompt's text and each backend tokenises differently), a whole prompt (chat template,
instruction, every image's tokens) longer than ``data.max_prompt_tokens``, more images than
``model.max_images``, a video of more frames than ``model.max_video_frames``, or an image whose resize to the
model's pixel bounds fails or leaves a side of zero. ``data.skip_bad_records`` leaves them out.

The length check is bounded: a prompt longer in characters than ``max_tokens`` times the vocabulary's longest
token cannot fit and is refused untokenised; only prompts near the limit are tokenised."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PIL import Image

from vlm_grpoma.datasets.images import image_size
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import DataError

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter

log = logging.getLogger(__name__)


def _longest_token(tokenizer) -> int:
    """Characters of the vocabulary's longest token (byte-level BPE: one character per byte), added ones too."""
    return max(len(token) for token in tokenizer.get_vocab())


def _special_token_in(prompt: str, special: Sequence[str]) -> str | None:
    return next((token for token in special if token in prompt), None)


def prompt_problems(records: Sequence[Record], adapter: QwenVLAdapter, max_tokens: int) -> dict[int, str]:
    """``{index: problem}`` for the records that ``adapter`` cannot turn into a prompt within ``max_tokens``
    tokens (0: no token limit), or whose prompt holds a special token. Only prompts that could exceed the
    limit are tokenised."""
    placeholder = Image.new("RGB", (1, 1))  # the chat template only needs to know there is an image
    special = sorted(adapter.tokenizer.all_special_tokens, key=len, reverse=True)
    longest = _longest_token(adapter.tokenizer)
    problems = {}
    for index, record in enumerate(records):
        if max_tokens and len(record.prompt) > max_tokens * longest:  # surely too long: not tokenised
            problems[index] = (
                f"prompt is {len(record.prompt)} characters, at least {-(-len(record.prompt) // longest)} "
                f"tokens (none is longer than {longest} characters), more than data.max_prompt_tokens={max_tokens}"
            )
            continue
        token = _special_token_in(record.prompt, special)
        if token is not None:
            problems[index] = (
                f"prompt holds the model's special token {token} (chat control or vision placeholder), "
                "which would be read as structure, not text; remove it"
            )
            continue
        count = len(record.prompt_images)
        if count > adapter.max_images:
            problems[index] = (
                f"{count} images, more than model.max_images={adapter.max_images}; raise it to {count} "
                "(each image adds its tokens to the prompt)"
            )
            continue
        frames = 0 if record.video is None else len(record.video.frames)  # a video file: counted when built
        if frames > adapter.max_video_frames:
            problems[index] = (
                f"a video of {frames} frames, more than model.max_video_frames={adapter.max_video_frames}; "
                f"set it to at least {frames}"
            )
            continue
        try:
            image_tokens = sum(_image_tokens(size, adapter) for size in _sizes(record))
        except (ValueError, DataError) as err:
            problems[index] = str(err)
            continue
        if record.video is not None:
            problem = _video_prompt_problem(record, adapter, max_tokens)
            if problem is not None:
                problems[index] = problem
            continue
        if not count or not max_tokens:  # text-only: no image to size
            continue
        text = adapter.render(adapter.messages(record, [placeholder] * count))
        if len(text.encode()) + image_tokens <= max_tokens:  # a byte-level BPE token covers at least 1 byte
            continue
        ids = adapter.tokenizer(text, add_special_tokens=False).input_ids
        tokens = len(ids) - count + image_tokens  # each image placeholder expands to its image's tokens
        if tokens > max_tokens:
            whose = "the image's" if count == 1 else f"the {count} images'"
            problems[index] = (
                f"prompt is {tokens} tokens ({image_tokens} of them {whose}), more than "
                f"data.max_prompt_tokens={max_tokens}"
            )
    return problems


def _video_prompt_problem(record: Record, adapter: QwenVLAdapter, max_tokens: int) -> str | None:
    """Why a record with a video cannot be a prompt: its frames, its images or its length. Measured on the
    prompt itself (the frames decoded): the video's tokens follow its resized frames, and Qwen3-VL writes a
    timestamp per temporal patch."""
    try:
        (inputs,) = adapter.build_inputs([record])
    except (ValueError, DataError) as err:
        return str(err).removeprefix(f"record {record.id}: ")
    tokens = len(inputs.input_ids)
    if max_tokens and tokens > max_tokens:
        video = int((inputs.input_ids == adapter.tokens.video_id).sum())
        return f"prompt is {tokens} tokens ({video} of them the video's), more than data.max_prompt_tokens={max_tokens}"
    return None


def _sizes(record: Record) -> list[tuple[str, tuple[int, int]]]:
    """``(name, (width, height))`` of each prompt image: the target's from the record, the others' from
    their file headers (a missing or unreadable file is an ImageLoadError naming it)."""
    return [
        ("image", (record.width, record.height))
        if path == record.image
        else (f"image {path}", image_size(path, record.id))
        for path in record.prompt_images
    ]


def _image_tokens(named_size: tuple[str, tuple[int, int]], adapter: QwenVLAdapter) -> int:
    """Vision tokens of one image after the processor's resize; a resize that fails or leaves a side shorter
    than one token is a ValueError naming the image."""
    name, (width, height) = named_size
    factor = adapter.family.factor
    try:
        resized_w, resized_h = adapter.resized_size(width, height)
    except ValueError as err:
        raise ValueError(f"{name} {width}x{height}: {err}") from None
    if min(resized_w, resized_h) < factor:
        raise ValueError(
            f"{name} {width}x{height} resizes to {resized_w}x{resized_h} within model.min_pixels/"
            "model.max_pixels: a side shorter than one vision token"
        )
    return (resized_w // factor) * (resized_h // factor)


def screen_records(
    records: list[Record], adapter: QwenVLAdapter, max_tokens: int, *, source: str, skip_bad: bool
) -> list[Record]:
    """``records`` without the ones :func:`prompt_problems` finds: the first is a DataError naming ``source``
    and the record, or with ``skip_bad`` they are left out with one warning line."""
    problems = prompt_problems(records, adapter, max_tokens)
    if not problems:
        return records
    first = min(problems)
    message = f"{source} (id {records[first].id}): {problems[first]}"
    if not skip_bad:
        raise DataError(message + "; fix or drop the record, or set data.skip_bad_records=true")
    log.warning(
        "%s: skipped %d of %d record(s) the model cannot take; first: %s",
        source,
        len(problems),
        len(records),
        message,
    )
    return [record for index, record in enumerate(records) if index not in problems]
