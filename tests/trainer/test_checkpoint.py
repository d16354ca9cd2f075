"""Checkpoints: exact resume, Hugging Face export (plain and LoRA), keep-last-N, atomic writes, RNG state."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from ds_worker import batch_ids, full_params, rng_batch, train_step

from vlm_grpoma.algorithm.diagnostics import GradientSpikeTracker
from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.trainer.checkpoint import (
    TrainerState,
    checkpoint_bytes,
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


LORA = ("model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.0", "optim.learning_rate=1e-2")


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_lora_checkpoint_holds_only_trainable_state_and_resumes_exactly(stage, make_config, tmp_path):
    """The DeepSpeed part stores the adapter and its optimizer state, not the frozen base (which resume
    reloads from model.name_or_path); 2 steps + save + resume + 2 steps still equal 4 straight steps."""
    cfg = make_config(*LORA, f"deepspeed.zero_stage={stage}", "optim.lr_scheduler=linear")
    out = tmp_path / "run"
    _seed(0)
    straight = build_engine(cfg)
    for step in range(4):
        train_step(straight, batch_ids(step, 0, 4))
    expected = full_params(straight)
    straight.close()

    _seed(0)
    first = build_engine(cfg)
    for step in range(2):
        train_step(first, batch_ids(step, 0, 4))
    saved = save_checkpoint(first, out, TrainerState(step=2))
    params = dict(first.module.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    numel = {n: p.ds_numel if stage == 3 else p.numel() for n, p in params.items()}
    first.close()

    state_dir = saved / "deepspeed" / "state"
    (model_states,) = state_dir.glob("*model_states.pt")  # ZeRO-3 names it per partition
    states = torch.load(model_states, weights_only=False)
    assert not {k for k in states["module"] if k in params} - trainable  # ZeRO-3: placeholders only
    assert states.get("frozen_param_fragments") is None
    # all tensors of the DeepSpeed part: the adapter (weights, fp32 master, two Adam moments), nothing frozen
    stored = sum(_tensor_numel(torch.load(f, weights_only=False)) for f in state_dir.glob("*.pt"))
    adapter = sum(numel[n] for n in trainable)
    assert adapter < sum(numel.values()) / 8 and stored <= 4 * adapter + 1000, (stored, adapter)
    assert checkpoint_bytes(saved)["deepspeed"] < 4 * (4 * adapter) + 200_000  # + pickled metadata

    _seed(12345)  # fresh LoRA weights and another RNG state: resume must restore the adapter, not keep these
    second = build_engine(cfg)
    assert load_checkpoint(second, saved).step == 2
    for step in range(2, 4):
        train_step(second, batch_ids(step, 0, 4))
    for name, param in full_params(second).items():
        assert torch.equal(param, expected[name]), name
    second.close()


def _tensor_numel(value) -> int:
    """Elements of every tensor inside nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return sum(_tensor_numel(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_numel(v) for v in value)
    return 0


def test_resume_refuses_a_checkpoint_of_other_trainable_parameters(make_config, tmp_path):
    saved = save_checkpoint(build_engine(make_config(*LORA)), tmp_path / "run", TrainerState(step=0))
    other = build_engine(make_config(*LORA[:3], "model.lora.target_modules=[q_proj]"))
    with pytest.raises(
        CheckpointError, match=r"module state does not match the model: missing \[\], unexpected \["
    ):
        load_checkpoint(other, saved)


@pytest.mark.parametrize("freeze_vision", [True, False], ids=["vision-frozen", "vision-trained"])
def test_saved_adapter_reloads_onto_exactly_the_trained_modules(
    arch, freeze_vision, make_config, tiny_model_dir, tmp_path
):
    """adapter_config.json names the targets with a family regex; PEFT puts the adapter back on the same
    language-model layers (none in the vision tower) and restores the vision tower only when it was trained."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    path = tiny_model_dir(arch)
    cfg = make_config(
        *LORA, f"model.name_or_path={path}", f"model.freeze_vision={str(freeze_vision).lower()}"
    )
    engine = build_engine(cfg)
    train_step(engine, batch_ids(0, 0, 4))
    saved = save_checkpoint(engine, tmp_path / "run", TrainerState(step=1))

    def adapted(model) -> tuple[set[str], set[str]]:
        lora = {n.removesuffix(".lora_A") for n, _ in model.named_modules() if n.endswith(".lora_A")}
        copies = {
            n.removesuffix(".modules_to_save")
            for n, _ in model.named_modules()
            if n.endswith(".modules_to_save")
        }
        return lora, copies

    adapter_config = json.loads((saved / "model" / "adapter_config.json").read_text())
    assert isinstance(adapter_config["target_modules"], str)
    assert adapter_config["target_modules"].startswith(r"(?:model\.language_model\.layers)\.\d+\.")
    base = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, saved / "model")
    trained_lora, trained_copies = adapted(engine.module)
    assert adapted(reloaded) == (trained_lora, trained_copies)
    assert len(trained_lora) == 7 * base.config.get_text_config().num_hidden_layers
    assert not any(".visual." in name for name in trained_lora)
    assert trained_copies == (set() if freeze_vision else {"base_model.model.model.visual"})
    for name, param in reloaded.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            torch.testing.assert_close(param, dict(engine.module.named_parameters())[name], rtol=0, atol=0)
    engine.close()
