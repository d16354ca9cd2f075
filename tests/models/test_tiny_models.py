"""Tiny offline checkpoints: reload through the Auto classes, real tokenizer behaviour, seed determinism, CLI."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.models.chat_format import SPECIAL_TOKENS
from vlm_grpoma.models.tiny import PRESETS, TAG_TOKENS


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_reloads_with_auto_classes_and_runs_forward(arch, tiny_model_dir):
    folder = tiny_model_dir(arch)
    assert AutoConfig.from_pretrained(folder).model_type == arch
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert model.config.model_type == arch and model.config.tie_word_embeddings
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the box."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert "<|vision_start|><|image_pad|><|vision_end|>Find the box.<|im_end|>" in text
    enc = processor(text=[text], images=[Image.new("RGB", (100, 80), "red")], return_tensors="pt")
    grid = enc["image_grid_thw"][0]
    n_image_tokens = int((enc["input_ids"] == model.config.image_token_id).sum())
    assert n_image_tokens == int(grid.prod()) // 4  # 2x2 patches merge into one token
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tokenizer_has_qwen_special_tokens_and_atomic_tags(tiny_model_dir):
    tok = AutoProcessor.from_pretrained(tiny_model_dir("qwen2_5_vl")).tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(ids[0], ids[0] + len(SPECIAL_TOKENS)))  # Qwen's order, consecutive
    for tag in TAG_TOKENS:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1
    text = '<think>the red box is near (31,40)</think><answer>[{"bbox_2d": [12, 345, 1000, 7]}]</answer>'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # digits are split one per token, as in Qwen's pre-tokenizer
    assert [t for t in tok.tokenize("1000") if t.strip("Ġ")] == ["1", "0", "0", "0"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    from vlm_grpoma.models.tiny import build_tiny_model

    a = build_tiny_model("qwen2_vl", tmp_path / "a", seed=3)
    b = build_tiny_model("qwen2_vl", tmp_path / "b", seed=3)
    c = build_tiny_model("qwen2_vl", tmp_path / "c", seed=4)
    assert _digest(a) == _digest(b) != _digest(c)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_presets_have_consistent_rope_sections():
    for name, p in PRESETS.items():
        assert sum(p.mrope_section) * 2 == p.head_dim, name
    assert PRESETS["small"].hidden == 128 and PRESETS["bench"].hidden == 256 and PRESETS["bench"].layers == 4


def test_cli_make_tiny_model(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli_main(["make-tiny-model", "--arch", "qwen3_vl", "--out", str(out), "--seed", "1"]) == 0
    assert AutoConfig.from_pretrained(out).model_type == "qwen3_vl"
    assert str(out) in capsys.readouterr().out


def test_unknown_preset_is_named(tmp_path):
    from vlm_grpoma.models.tiny import build_tiny_model

    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        build_tiny_model("qwen2_vl", tmp_path, preset="huge")
