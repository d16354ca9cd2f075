"""The DeepSpeed engine in one process: gradients vs plain torch, skipped steps, LR schedule, contexts."""

from __future__ import annotations

import math

import pytest
import torch
from ds_worker import batch_ids, full_params, micro_loss, train_step

from vlm_grpoma.config import ConfigError, load_config
from vlm_grpoma.models.loading import prepare_trainable, vision_module_names
from vlm_grpoma.trainer.deepspeed_config import deepspeed_config
from vlm_grpoma.trainer.engine import build_engine
from vlm_grpoma.trainer.optim import lr_factor


def _plain_model(path, cfg):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return prepare_trainable(model, cfg.model)


# ---------------------------------------------------------------------------------------------------------
# Config merge and schedule (no process group)


def test_deepspeed_config_takes_batch_precision_and_clipping_from_the_run_config(tmp_path):
    cfg = load_config(
        None,
        [
            "train.prompts_per_step=16",
            "train.micro_batch_prompts=2",
            "optim.max_grad_norm=0.5",
            "deepspeed.zero_stage=3",
        ],
    )
    ds = deepspeed_config(cfg, world_size=2, on_gpu=False)
    assert (
        ds["train_batch_size"],
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    ) == (16, 2, 4)
    assert ds["gradient_clipping"] == 0.5 and not ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    assert (
        ds["zero_optimization"]["stage"] == 3
        and ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    )
    one = deepspeed_config(load_config(None, ["deepspeed.zero_stage=1"]), world_size=1, on_gpu=False)
    assert one["zero_optimization"]["stage"] == 1 and one["zero_optimization"]["contiguous_gradients"]

    with pytest.raises(ConfigError, match="deepspeed.precision: fp16 needs a GPU"):
        deepspeed_config(load_config(None, ["deepspeed.precision=fp16"]), world_size=1, on_gpu=False)
    cpu_bf16 = deepspeed_config(load_config(None, ["deepspeed.precision=bf16"]), world_size=1, on_gpu=False)
    assert cpu_bf16["bf16"]["enabled"] and not cpu_bf16["fp16"]["enabled"]
    with pytest.raises(ConfigError, match="model.dtype: float32 contradicts deepspeed.precision=bf16"):
        deepspeed_config(
            load_config(None, ["deepspeed.precision=bf16", "model.dtype=float32"]), 1, on_gpu=True
        )
    with pytest.raises(ConfigError, match="deepspeed.config_file: .*missing.json not found"):
        deepspeed_config(
            load_config(None, [f"deepspeed.config_file={tmp_path / 'missing.json'}"]), 1, on_gpu=False
        )
    with pytest.raises(ConfigError, match="train.prompts_per_step"):
        deepspeed_config(load_config(None, ["train.prompts_per_step=6"]), world_size=4, on_gpu=False)


def test_lr_schedule_values():
    def factors(schedule):
        return [lr_factor(s, schedule=schedule, warmup_steps=2, total_steps=6) for s in range(6)]

    assert factors("constant") == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1])
    assert factors("linear") == pytest.approx([1 / 3, 2 / 3, 1, 0.75, 0.5, 0.25])
    cos = [0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75)]
    assert factors("cosine") == pytest.approx([1 / 3, 2 / 3, *cos])


# ---------------------------------------------------------------------------------------------------------
# Engine


@pytest.mark.parametrize(("stage", "checkpointing"), [(0, False), (2, False), (3, False), (2, True)])
def test_gradient_and_update_equal_plain_torch(stage, checkpointing, make_config, tiny_path):
    """The effective gradient is the SUM of micro-batch gradients (no 1/GAS), clipped, then one AdamW step."""
    from deepspeed.utils import safe_get_full_grad
    from transformers.integrations import is_deepspeed_zero3_enabled

    cfg = make_config(
        f"deepspeed.zero_stage={stage}",
        "optim.max_grad_norm=0.5",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
    )
    reference = _plain_model(tiny_path, cfg)  # before the engine: ZeRO-3 makes from_pretrained partition
    engine = build_engine(cfg)
    assert is_deepspeed_zero3_enabled() is (stage == 3)
    assert any(getattr(m, "gradient_checkpointing", False) for m in engine.module.modules()) is checkpointing
    assert engine.gradient_accumulation_steps == 2
    ids = batch_ids(0, 0, rows=4)
    for start in (0, 2):
        engine.backward(micro_loss(engine.deepspeed, ids[start : start + 2], batch_rows=4))
    grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    result = engine.step()

    micro_loss(reference, ids, batch_rows=4).backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.requires_grad}
    # vision frozen by default
    assert grads.keys() == ref_grads.keys() and not any("visual" in n for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    ref_norm = torch.nn.utils.clip_grad_norm_(list(ref_grads_params(reference)), max_norm=0.5)
    assert not result.skipped and result.grad_norm == pytest.approx(float(ref_norm), rel=1e-5)
    assert result.grad_norm > 0.5  # clipping was active

    # The update must be one clipped AdamW step on the engine's own gradients, whose equality with plain torch
    # is asserted above. (AdamW on the reference's gradients is not a fair target: where a gradient is near
    # Adam's eps, the first step's g / (|g| + eps) turns a 1e-11 difference in g into a 1e-6 one in the weight.)
    for name, param in reference.named_parameters():
        if param.requires_grad:
            param.grad = grads[name].clone()
    torch.nn.utils.clip_grad_norm_(list(ref_grads_params(reference)), max_norm=0.5)
    torch.optim.AdamW(
        [p for p in reference.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0
    ).step()
    ref_params = dict(reference.named_parameters())
    try:
        for name, param in full_params(engine).items():
            torch.testing.assert_close(param, ref_params[name].detach(), rtol=0, atol=2e-6, msg=name)
    finally:
        engine.close()  # a failure must not leave ZeRO-3 switched on for the tests after it
    assert not is_deepspeed_zero3_enabled()


def ref_grads_params(model):
    return (p for p in model.parameters() if p.grad is not None)


def _optimizer_tensors(engine) -> dict[str, torch.Tensor]:
    opt = engine.deepspeed.basic_optimizer
    return {f"{i}.{k}": v.clone() for i, state in enumerate(opt.state.values()) for k, v in state.items()}


@pytest.mark.parametrize("stage", [0, 2])
@pytest.mark.parametrize("fault", ["nan_loss", "nan_grad"])
def test_non_finite_step_is_skipped_and_leaves_everything_untouched(stage, fault, make_config):
    cfg = make_config(f"deepspeed.zero_stage={stage}", "optim.lr_scheduler=linear", "optim.warmup_steps=1")
    engine = build_engine(cfg)
    first = train_step(engine, batch_ids(0, 0, 4))
    assert not first.skipped and math.isfinite(first.grad_norm)
    params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    moments, lr = _optimizer_tensors(engine), engine.learning_rate
    assert moments

    ids = batch_ids(1, 0, 4)
    engine.backward(micro_loss(engine.deepspeed, ids[:2], 4))
    loss = micro_loss(engine.deepspeed, ids[2:], 4)
    if fault == "nan_loss":
        loss = loss + float("nan")
    else:  # finite loss, NaN gradient: d/dw sqrt(|w - w|^2) = 0/0
        weight = engine.deepspeed.module.lm_head.weight
        loss = loss + torch.sqrt(((weight - weight.detach()) ** 2).sum())
        assert torch.isfinite(loss)
    engine.backward(loss)
    skipped = engine.step()

    assert skipped.skipped and not math.isfinite(skipped.grad_norm)
    for name, param in engine.module.named_parameters():
        assert torch.equal(param, params[name]), name
    after = _optimizer_tensors(engine)
    assert after.keys() == moments.keys() and all(torch.equal(after[k], v) for k, v in moments.items())
    assert engine.learning_rate == lr  # the schedule did not advance either

    resumed = train_step(engine, batch_ids(2, 0, 4))
    assert not resumed.skipped and math.isfinite(resumed.grad_norm)
    assert any(not torch.equal(p, params[n]) for n, p in engine.module.named_parameters())


def test_learning_rates_follow_the_schedule_and_misuse_is_caught(make_config):
    cfg = make_config("optim.lr_scheduler=cosine", "optim.warmup_steps=1", "train.steps=3")
    engine = build_engine(cfg)
    seen = [train_step(engine, batch_ids(s, 0, 4)).learning_rate for s in range(3)]
    expected = [1e-3 * lr_factor(s, schedule="cosine", warmup_steps=1, total_steps=3) for s in range(3)]
    assert seen == pytest.approx(expected, rel=1e-9)
    assert engine.optimizer_steps == 3
    with pytest.raises(RuntimeError, match="exactly 2 micro-batches"):
        engine.step()
    ids = batch_ids(9, 0, 4)
    for start in (0, 2):
        engine.backward(micro_loss(engine.deepspeed, ids[start : start + 2], 4))
    with pytest.raises(RuntimeError, match="more than gradient_accumulation_steps=2"):
        engine.backward(micro_loss(engine.deepspeed, ids[:2], 4))


@pytest.mark.parametrize("stage", [0, 3])
def test_generation_and_frozen_reference(stage, make_config):
    engine = build_engine(make_config("algorithm.kl_beta=0.1", f"deepspeed.zero_stage={stage}"))
    assert engine.has_reference and engine.module.training
    ids = batch_ids(0, 0, 2)
    with engine.generation() as module:
        assert not module.training and not torch.is_grad_enabled()
        before = module(input_ids=ids).logits
        generated = module.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert engine.module.training and generated.shape == (2, ids.shape[1] + 3)
    with engine.reference() as reference:
        assert all(not p.requires_grad for p in reference.parameters())
        torch.testing.assert_close(reference(input_ids=ids).logits, before, rtol=0, atol=1e-6)
    for step in range(2):
        train_step(engine, batch_ids(step, 0, 4))
    with engine.reference() as reference, engine.generation() as module:
        torch.testing.assert_close(reference(input_ids=ids).logits, before, rtol=0, atol=1e-6)
        assert not torch.allclose(module(input_ids=ids).logits, before)
    engine.close()

    no_kl = build_engine(make_config())
    assert not no_kl.has_reference and no_kl.reference_module is None
    with pytest.raises(RuntimeError, match="kl_beta is 0"), no_kl.reference():
        pass


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_lora_targets_the_language_model_and_reference_is_the_base(freeze_vision, make_config):
    cfg = make_config(
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.dropout=0.0",
        "algorithm.kl_beta=0.1",
        f"model.freeze_vision={str(freeze_vision).lower()}",
        "optim.learning_rate=1e-2",
    )
    engine = build_engine(cfg)
    assert engine.is_lora and engine.reference_module is None
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    vision = vision_module_names(engine.module)
    in_vision = [n for n in trainable if any(v.rsplit(".", 1)[-1] + "." in n for v in vision)]
    assert trainable and all("lora_" in n for n in trainable if n not in in_vision)
    assert bool(in_vision) is not freeze_vision
    assert all("modules_to_save" in n for n in in_vision)
    ids = batch_ids(0, 0, 2)
    with engine.generation() as module:
        base = module(input_ids=ids).logits
    for step in range(2):
        train_step(engine, batch_ids(step, 0, 4))
    with engine.reference() as reference:
        torch.testing.assert_close(reference(input_ids=ids).logits, base, rtol=0, atol=1e-6)
    with engine.generation() as module:
        assert not torch.allclose(module(input_ids=ids).logits, base)
