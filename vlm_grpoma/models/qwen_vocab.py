"""Qwen2's real tokenizer built offline from the BPE ranks in the ``dashscope`` wheel (``qwen.tiktoken``).

The wheel (Apache-2.0) is a plain zip the Makefile downloads into the project cache; it is read, never
installed. transformers' ``TikTokenConverter`` turns the ranks into vocab + merges, which give a Qwen2
tokenizer bit-exact with the released one (``"Hello world"`` → ``[9707, 1879]``); the result is cached.
"""

from __future__ import annotations

import base64
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.models.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS

WHEEL_NAME = "dashscope-2.0.2-py3-none-any.whl"
TIKTOKEN_MEMBER = "dashscope/resources/qwen.tiktoken"


def wheel_path() -> Path:
    return cache_dir() / "wheels" / WHEEL_NAME


def _ranks(wheel: Path) -> dict[bytes, int]:
    with zipfile.ZipFile(wheel) as zf:
        lines = zf.read(TIKTOKEN_MEMBER).decode().splitlines()
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in lines if line)}


def build_qwen2_tokenizer(wheel: Path | None = None) -> Any:
    """The real Qwen2 tokenizer (151,643 BPE ranks + Qwen's special tokens in id order, chat template)."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    wheel = wheel or wheel_path()
    if not wheel.is_file():
        raise FileNotFoundError(
            f"{wheel}: dashscope wheel not found (the Makefile downloads it into the cache)"
        )
    ranks = _ranks(wheel)

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    vocab, merges = _Converter(vocab_file=str(wheel)).extract_vocab_merges_from_model(str(wheel))
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, errors="replace")
    for token in SPECIAL_TOKENS[1:]:  # one at a time, so each takes the next id (151644, ...)
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [token]}, replace_extra_special_tokens=False
        )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_qwen2_tokenizer() -> Any:
    """The real Qwen2 tokenizer, built once and cached under ``<cache>/qwen2-tokenizer``."""
    from transformers import AutoTokenizer

    target = cache_dir() / "qwen2-tokenizer"
    if not (target / "tokenizer.json").is_file():
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        build_qwen2_tokenizer().save_pretrained(tmp)
        try:
            tmp.rename(target)  # atomic; another process may have won the race
        except OSError:
            shutil.rmtree(tmp)
    return AutoTokenizer.from_pretrained(target)
