"""Tiny Qwen-VL models built offline: a random model of each family plus a real tokenizer and processors.

The folder written by :func:`build_tiny_model` is a normal Hugging Face checkpoint that ``AutoProcessor`` and
``AutoModelForImageTextToText`` reload. The tokenizer is a byte-level BPE trained on generated prompt/answer
text (digits, JSON punctuation, the think/answer tags, task words) with Qwen's special tokens and chat
template, so coordinates tokenise like they do for the real models. Everything follows from the seed.
CLI: ``vlm-grpoma make-tiny-model --arch {qwen2_vl,qwen2_5_vl,qwen3_vl} --out DIR [--seed S] [--preset P]``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.models.chat_format import CHAT_TEMPLATE, SPECIAL_TOKENS
from vlm_grpoma.models.families import ARCHS
from vlm_grpoma.models.prompts import (
    ANSWER_CLOSE,
    ANSWER_FORMATS,
    ANSWER_OPEN,
    SYSTEM_PROMPT,
    TASK_LEADS,
    THINK_CLOSE,
    THINK_OPEN,
    FrameSpec,
)
from vlm_grpoma.output_folder import writable_folder

#: The plain think/answer tags, added to the tiny tokenizer after chat_format.SPECIAL_TOKENS.
TAG_TOKENS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


@dataclass(frozen=True)
class TinyPreset:
    """Sizes of a tiny model; ``mrope_section`` must sum to head_dim / 2."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    mrope_section: tuple[int, int, int]
    vision_hidden: int
    vision_heads: int
    vision_depth: int = 2
    rope_theta: float = 100.0
    bpe_vocab: int = 1024
    #: Qwen2.5-VL window attention: window side in pixels (the released models use 112)
    window_size: int = 56

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS: dict[str, TinyPreset] = {
    # fastest, for tests
    "tiny": TinyPreset(64, 256, 2, 4, 2, (2, 3, 3), vision_hidden=32, vision_heads=2),
    # learns the shapes task on CPU (the model of docs/results.md)
    "small": TinyPreset(128, 512, 2, 4, 2, (4, 6, 6), vision_hidden=64, vision_heads=4),
    # larger CPU-feasible model for benchmarks
    "bench": TinyPreset(256, 1024, 4, 8, 4, (4, 6, 6), vision_hidden=64, vision_heads=4),
    # "tiny" with Qwen2.5-VL's real 112-px attention windows (only images of 224 px or more span several)
    "window": TinyPreset(64, 256, 2, 4, 2, (2, 3, 3), vision_hidden=32, vision_heads=2, window_size=112),
}
#: The real Qwen2 vocabulary: 151,643 BPE ranks + special tokens, padded to the released embedding size.
REAL_VOCAB_SIZE = 151936

#: Image bounds of the saved processors: 56^2..112^2 pixels gives 4..16 image tokens (patch 14, merge 2).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112


def _corpus(seed: int, n: int = 3000) -> list[str]:
    """Generated text covering the prompts, tags, JSON answers and numbers the models will read and write."""
    rng = random.Random(seed)
    words = [
        "red",
        "green",
        "blue",
        "yellow",
        "purple",
        "orange",
        "white",
        "black",
        "large",
        "small",
        "square",
        "circle",
        "triangle",
        "drawer",
        "door",
        "handle",
        "cabinet",
        "object",
        "left",
        "right",
        "top",
        "bottom",
        "near",
        "the",
        "is",
        "at",
        "open",
        "pull",
        "push",
        "grasp",
        "move",
        "box",
        "point",
        "center",
    ]
    fixed = [
        SYSTEM_PROMPT,
        *ANSWER_FORMATS.values(),
        *TASK_LEADS.values(),
        FrameSpec(1000).describe(0, 0),
        FrameSpec(None).describe(112, 84),
    ]
    texts = fixed * 5
    for _ in range(n):
        nums = [
            str(rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 1000)]))
            for _ in range(4)
        ]
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))
        label = " ".join(rng.choice(words) for _ in range(2))
        answer = rng.choice(
            [
                f'[{{"bbox_2d": [{", ".join(nums)}], "label": "{label}"}}]',
                f'[{{"point_2d": [{nums[0]}, {nums[1]}]}}]',
                f"[[{nums[0]}, {nums[1]}], [{nums[2]}, {nums[3]}]]",
                f'{{"point_2d": [{nums[0]}, {nums[1]}], "up": [0.{nums[2]}, -0.{nums[3]}, 1.0], "forward": [1, 0, 0]}}',
            ]
        )
        texts.append(
            f"{THINK_OPEN}{phrase} near ({nums[0]},{nums[1]}){THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
        )
        texts.append(TASK_LEADS[rng.choice(list(TASK_LEADS))].format(prompt=phrase))
    return texts


def build_tokenizer(
    seed: int = 0,
    vocab_size: int = 512,
    added_tokens: Sequence[str] = TAG_TOKENS,
    chat_template: str = CHAT_TEMPLATE,
):
    """Byte-level BPE with Qwen's pre-tokenizer regex, special tokens and a chat template.

    ``added_tokens`` become single (non-special) tokens after the special ones: the think/answer tags by
    default; a release's own list to mimic its vocabulary (Qwen3 adds ``<think>``/``</think>`` only).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    # only for its pre-tokenizer (Qwen regex + byte level), normalizer and decoder
    template = Qwen2Tokenizer()
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = template.backend_tokenizer.normalizer
    bpe.pre_tokenizer = template.backend_tokenizer.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, errors="replace")
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.add_tokens(list(added_tokens))
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = chat_template
    return tokenizer


def _special_ids(tokenizer) -> dict[str, int]:
    """The vision token ids a Qwen-VL config names, read from ``tokenizer``."""
    return {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }


def build_config(arch: str, preset: TinyPreset, tokenizer, vocab_size: int | None = None):
    """The model config of one family at the given size, with token ids from ``tokenizer``; the embedding
    has ``vocab_size`` rows (default: the tokenizer's length rounded up to 64)."""
    import transformers as tf

    vocab = vocab_size or (len(tokenizer) + 63) // 64 * 64
    rope = {
        "rope_type": "default",
        "rope_theta": preset.rope_theta,
        "mrope_section": list(preset.mrope_section),
    }
    text = dict(
        vocab_size=vocab,
        hidden_size=preset.hidden,
        intermediate_size=preset.intermediate,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        max_position_embeddings=4096,
        rope_parameters=rope,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    v = preset
    if arch == "qwen2_vl":
        vision = dict(
            depth=v.vision_depth,
            embed_dim=v.vision_hidden,
            hidden_size=v.hidden,
            num_heads=v.vision_heads,
            mlp_ratio=2,
            patch_size=14,
        )
        cls = tf.Qwen2VLConfig
    elif arch == "qwen2_5_vl":
        vision = dict(
            depth=v.vision_depth,
            hidden_size=v.vision_hidden,
            intermediate_size=2 * v.vision_hidden,
            num_heads=v.vision_heads,
            out_hidden_size=v.hidden,
            patch_size=14,
            window_size=v.window_size,
            fullatt_block_indexes=[v.vision_depth - 1],
        )
        cls = tf.Qwen2_5_VLConfig
    elif arch == "qwen3_vl":
        rope["mrope_interleaved"] = True
        text["head_dim"] = v.head_dim
        vision = dict(
            depth=v.vision_depth,
            hidden_size=v.vision_hidden,
            intermediate_size=2 * v.vision_hidden,
            num_heads=v.vision_heads,
            out_hidden_size=v.hidden,
            patch_size=16,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        cls = tf.Qwen3VLConfig
    else:
        raise ValueError(f"unsupported arch {arch!r}; expected one of {', '.join(ARCHS)}")
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=True, **_special_ids(tokenizer))


def build_processor(arch: str, tokenizer, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS):
    """Image + video processors with the given pixel bounds (default: small ones), in the family's processor
    class (with the tokenizer's chat template)."""
    import transformers as tf

    patch = 16 if arch == "qwen3_vl" else 14
    factor = patch * 2
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    # Qwen3-VL releases normalise images and videos with mean = std = 0.5 (SigLIP's), Qwen2/2.5-VL with CLIP's
    # (the processor's default); vLLM normalises both modalities on the device with the image processor's values
    release = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if arch == "qwen3_vl" else {}
    image = tf.Qwen2VLImageProcessor(size=size, patch_size=patch, merge_size=2, **release)
    if arch == "qwen3_vl":
        video = tf.Qwen3VLVideoProcessor(
            size={"shortest_edge": factor * factor * 4, "longest_edge": max_pixels * 2},
            patch_size=patch,
            merge_size=2,
        )
        cls = tf.Qwen3VLProcessor
    else:
        video = tf.Qwen2VLVideoProcessor(size=size, patch_size=patch, merge_size=2)
        cls = tf.Qwen2_5_VLProcessor if arch == "qwen2_5_vl" else tf.Qwen2VLProcessor
    return cls(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=tokenizer.chat_template,
    )


def build_tiny_model(
    arch: str,
    out: str | Path,
    seed: int = 0,
    preset: str = "tiny",
    tokenizer=None,
    real_vocab: bool = False,
) -> Path:
    """Build a random tiny model of family ``arch`` with its processor and save both to ``out``.

    ``tokenizer``: the vocabulary and chat template to use instead of :func:`build_tokenizer`'s;
    ``real_vocab``: the real Qwen2 tokenizer (:mod:`~vlm_grpoma.models.qwen_vocab`) and its 151,936-row
    embedding instead of the small trained BPE, so sampling and the loss see the real vocabulary's size.
    """
    import torch
    import transformers as tf

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    if real_vocab:
        from vlm_grpoma.models.qwen_vocab import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer("qwen2")
        tokenizer.pad_token = "<|endoftext|>"
    tokenizer = tokenizer or build_tokenizer(seed, PRESETS[preset].bpe_vocab)
    config = build_config(arch, PRESETS[preset], tokenizer, REAL_VOCAB_SIZE if real_vocab else None)
    torch.manual_seed(seed)
    model = tf.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    build_processor(arch, tokenizer).save_pretrained(out)
    return out


def main(args: argparse.Namespace) -> int:
    """``make-tiny-model`` handler; the output folder is checked writable before the model is built."""
    out = build_tiny_model(
        args.arch,
        writable_folder(args.out, "--out"),
        seed=args.seed,
        preset=getattr(args, "preset", "tiny"),
        real_vocab=getattr(args, "real_vocab", False),
    )
    print(f"wrote a tiny {args.arch} model and processor to {out}")
    return 0
