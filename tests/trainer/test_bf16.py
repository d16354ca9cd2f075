"""bf16 end to end on CPU: model, reference model and DeepSpeed bf16 (ZeRO 2 and 3) for every family, and the
bf16 log-probs next to fp32's at a stated tolerance."""

from __future__ import annotations

import math

import pytest
import torch
from length_reward import AnswerLength  # noqa: F401  (registers test_answer_length)

from tests.trainer.test_packed import _prompts, _ragged_tree
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.logprobs import path_log_probs
from vlm_grpoma.trainer.packed import shared_prefix_log_probs
from vlm_grpoma.trainer.sft import SFTTrainer

#: |logp_bf16 - logp_fp32| per token on the tiny models, measured max 0.0026 nats and mean 0.0007 (all three
#: families, both passes). A log-softmax in bf16 would miss by ~0.03: bf16 resolves a log-sum-exp of about
#: log V = 8 only to 2^-8 * 8; hence the fp32 log-softmax over bf16 logits (``trainer/logprobs.py``).
BF16_ATOL = 0.01
BF16_MEAN_ATOL = 0.002


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    return generate_shapes("detection", 4, tmp_path_factory.mktemp("shapes"), seed=0, config=EASY)


def _bf16_config(make_config, tiny_model_dir, arch, stage, data_path, *extra):
    return make_config(
        f"model.name_or_path={tiny_model_dir(arch)}",
        f"data.train_path={data_path}",
        "deepspeed.precision=bf16",
        f"deepspeed.zero_stage={stage}",
        "train.steps=1",
        "train.prompts_per_step=2",
        "train.micro_batch_prompts=1",
        *extra,
    )


def _assert_bf16(trainer) -> None:
    engine = trainer.engine
    assert engine.precision == "bf16"
    assert {p.dtype for p in engine.module.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("stage", [2, 3])
def test_grpo_ma_step_in_bf16(arch, stage, make_config, tiny_model_dir, data_path):
    config = _bf16_config(
        make_config,
        tiny_model_dir,
        arch,
        stage,
        data_path,
        "algorithm.kl_beta=0.1",  # the reference model takes part, in bf16 too
        "rewards.weights={test_answer_length: 1.0}",
        "rollout.num_thoughts=2",
        "rollout.answers_per_thought=2",
        "rollout.max_thought_tokens=6",
        "rollout.max_answer_tokens=6",
    )
    trainer = GRPOMATrainer(config)
    _assert_bf16(trainer)
    reference = trainer.engine.reference_module
    ref_params = reference.module.parameters() if stage == 3 else reference.parameters()
    assert {p.dtype for p in ref_params} == {torch.bfloat16}
    with trainer.engine.generation():  # ZeRO-3: the full weights
        before = {n: p.detach().float().clone() for n, p in trainer.engine.module.named_parameters()}
    (metrics,) = trainer.train()
    assert metrics["train/skipped_steps"] == 0
    assert math.isfinite(metrics["loss/total"]) and 0 < metrics["train/grad_norm"] < math.inf
    assert metrics["rollout/logp_mismatch_mean"] < BF16_ATOL  # bf16 rollout (KV cache) vs bf16 packed pass
    with trainer.engine.generation():
        after = {n: p.detach().float() for n, p in trainer.engine.module.named_parameters()}
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize("stage", [2, 3])
def test_sft_step_in_bf16(arch, stage, make_config, tiny_model_dir, data_path):
    trainer = SFTTrainer(_bf16_config(make_config, tiny_model_dir, arch, stage, data_path))
    _assert_bf16(trainer)
    (metrics,) = trainer.train()
    assert math.isfinite(metrics["sft/nll"]) and metrics["train/skipped_steps"] == 0


def test_bf16_log_probs_match_fp32(arch, tiny_model_dir, tmp_path):
    """The same weights in bf16 and fp32: both passes' log-probs within BF16_ATOL per token (fp32 log-softmax
    over bf16 logits), and the bf16 packed pass equals the bf16 naive pass as closely."""
    models = {
        dtype: load_model(ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype=dtype))
        for dtype in ("float32", "bfloat16")
    }
    adapter = models["float32"].adapter
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, seed=5)
    with torch.no_grad():
        out = {
            (dtype, fn.__name__): fn(loaded.model.eval(), tree, [0, 1, 2], adapter.tokens)
            for dtype, loaded in models.items()
            for fn in (shared_prefix_log_probs, path_log_probs)
        }
    assert out["bfloat16", "shared_prefix_log_probs"].answer.dtype == torch.float32
    mask = torch.cat([tree.thought_mask.flatten(), tree.answer_mask.flatten()])
    for name in ("shared_prefix_log_probs", "path_log_probs"):
        fp32, bf16 = out["float32", name], out["bfloat16", name]
        diff = torch.cat([(bf16.thought - fp32.thought).flatten(), (bf16.answer - fp32.answer).flatten()])
        diff = diff[mask].abs()
        assert 0 < diff.max() < BF16_ATOL and diff.mean() < BF16_MEAN_ATOL, (name, diff.max(), diff.mean())
    packed, naive = out["bfloat16", "shared_prefix_log_probs"], out["bfloat16", "path_log_probs"]
    torch.testing.assert_close(packed.answer, naive.answer, atol=BF16_ATOL, rtol=0)
