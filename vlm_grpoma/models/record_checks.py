"""Records this model cannot take, found when they are loaded rather than when first sampled: a prompt holding
one of the tokenizer's special tokens (chat control ``<|im_end|>``, vision placeholders ``<|image_pad|>``: they
would restructure the conversation or break the image-token count, so they are refused, not escaped — an
escape would change the prompt's text and each backend tokenises differently), a whole prompt (chat template,
instruction, image tokens) longer than ``data.max_prompt_tokens``, or an image whose resize to the model's
pixel bounds fails or leaves a side of zero. ``data.skip_bad_records`` leaves them out.

The length check is bounded: a prompt longer in characters than ``max_tokens`` times the vocabulary's longest
token cannot fit and is refused untokenised; only prompts near the limit are tokenised."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PIL import Image

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
    factor = adapter.family.factor
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
        if record.image is None:  # text-only: no image to size
            continue
        try:
            width, height = adapter.resized_size(record.width, record.height)
        except ValueError as err:
            problems[index] = f"image {record.width}x{record.height}: {err}"
            continue
        if min(width, height) < factor:
            problems[index] = (
                f"image {record.width}x{record.height} resizes to {width}x{height} within model.min_pixels/"
                "model.max_pixels: a side shorter than one vision token"
            )
            continue
        if not max_tokens:
            continue
        image_tokens = (width // factor) * (height // factor)
        text = adapter.processor.apply_chat_template(
            adapter.messages(record, placeholder), tokenize=False, add_generation_prompt=True
        )
        if len(text.encode()) + image_tokens <= max_tokens:  # a byte-level BPE token covers at least 1 byte
            continue
        ids = adapter.tokenizer(text, add_special_tokens=False).input_ids
        tokens = len(ids) - 1 + image_tokens  # the one image placeholder expands to the image tokens
        if tokens > max_tokens:
            problems[index] = (
                f"prompt is {tokens} tokens ({image_tokens} of them the image's), more than "
                f"data.max_prompt_tokens={max_tokens}"
            )
    return problems


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
