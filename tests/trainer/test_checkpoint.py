"""Checkpoints: exact resume, Hugging Face export (plain and LoRA), keep-last-N, atomic writes, RNG state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from ds_worker import batch_ids, rng_batch, train_step

from vlm_grpoma.algorithm.diagnostics import GradientSpikeTracker
from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.trainer.checkpoint import (
    TrainerState,
    choose_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from vlm_grpoma.trainer.engine import build_engine


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    _seed(3)
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = _draws()
    _seed(99)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected


def _params(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


@pytest.mark.parametrize("stage", [0, 2])
def test_two_steps_plus_resume_plus_two_equals_four_steps(stage, make_config, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    cfg = make_config(f"deepspeed.zero_stage={stage}", "optim.lr_scheduler=linear", "optim.warmup_steps=1")
    out = tmp_path / "run"

    _seed(0)
    straight = build_engine(cfg)
    for _ in range(4):
        train_step(straight, rng_batch(4))
    expected = _params(straight)

    _seed(0)
    first = build_engine(cfg)
    tracker = GradientSpikeTracker()
    for _ in range(2):
        tracker.update(train_step(first, rng_batch(4)).grad_norm)
    processor = AutoProcessor.from_pretrained(cfg.model.name_or_path)
    saved = save_checkpoint(
        first,
        out,
        TrainerState(step=2, data={"offset": 8}, metrics={"gss": tracker.state_dict()}),
        processor=processor,
    )
    at_save = _params(first)

    _seed(12345)  # a different process state; resume must restore it
    second = build_engine(cfg)
    path = choose_checkpoint("auto", out)
    assert path == saved
    state = load_checkpoint(second, path)
    assert state.step == 2 and state.data == {"offset": 8} and state.metrics["gss"] == tracker.state_dict()
    for _ in range(2):
        train_step(second, rng_batch(4))
    for name, param in _params(second).items():
        assert torch.equal(param, expected[name]), name

    exported = AutoModelForImageTextToText.from_pretrained(saved / "model", dtype=torch.float32)
    for name, param in exported.named_parameters():
        assert torch.equal(param, at_save[name]), name
    assert (
        AutoProcessor.from_pretrained(saved / "model").tokenizer.vocab_size == processor.tokenizer.vocab_size
    )


def test_keep_last_and_a_crash_mid_save_leaves_the_previous_checkpoint(make_config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    engine = build_engine(make_config())
    for step in (1, 2, 3):
        train_step(engine, batch_ids(step, 0, 4))
        save_checkpoint(engine, out, TrainerState(step=step), keep_last=2)
    assert [p.name for p in list_checkpoints(out)] == ["step-00000002", "step-00000003"]
    at_three = _params(engine)

    train_step(engine, batch_ids(4, 0, 4))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(engine.deepspeed, "save_checkpoint", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(engine, out, TrainerState(step=4), keep_last=2)
    assert (out / "checkpoints" / ".tmp-step-00000004" / "model").is_dir()  # half written, never renamed
    (out / "checkpoints" / "step-00000009").mkdir()  # a folder without checkpoint.json is not a checkpoint
    newest = choose_checkpoint("auto", out)
    assert newest.name == "step-00000003"
    assert load_checkpoint(engine, newest).step == 3
    for name, param in _params(engine).items():
        assert torch.equal(param, at_three[name]), name

    monkeypatch.undo()
    save_checkpoint(engine, out, TrainerState(step=4), keep_last=2)
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in list_checkpoints(out)] == ["step-00000003", "step-00000004"]
    assert choose_checkpoint("none", out) is None and choose_checkpoint("auto", tmp_path / "nothing") is None
    assert choose_checkpoint(str(out / "checkpoints" / "step-00000003"), out).name == "step-00000003"
    with pytest.raises(CheckpointError, match="step-00000009 is not a complete checkpoint"):
        choose_checkpoint(str(out / "checkpoints" / "step-00000009"), out)


def test_lora_checkpoint_exports_adapter_or_merged_model(make_config, tmp_path, tiny_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    cfg = make_config(
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.dropout=0.0",
        "model.freeze_vision=false",
        "optim.learning_rate=1e-2",
    )
    engine = build_engine(cfg)
    for step in range(2):
        train_step(engine, batch_ids(step, 0, 4))
    ids = batch_ids(7, 0, 2)
    with engine.generation() as module:
        trained = module(input_ids=ids).logits

    merged = save_checkpoint(engine, tmp_path / "merged", TrainerState(step=2), merge_lora=True)
    model = AutoModelForImageTextToText.from_pretrained(merged / "model", dtype=torch.float32).eval()
    torch.testing.assert_close(model(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)

    adapter = save_checkpoint(engine, tmp_path / "adapter", TrainerState(step=2))
    assert (adapter / "model" / "adapter_config.json").is_file()
    base = AutoModelForImageTextToText.from_pretrained(tiny_path, dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, adapter / "model").eval()
    torch.testing.assert_close(reloaded(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)
