"""What only a CUDA device can check (``-m gpu``; skipped without one; ``scripts/device_check.sh`` runs them):
FlexAttention's fused kernels and their gradients against the dense-mask pass, the packed pass against the
naive one, the hf rollout's KV-cache reuse, and a bf16 GRPO-MA step with ZeRO-2 on one GPU."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainer.pass_agreement import assert_shared_equals_naive, weighted_grads
from tests.trainer.test_packed import _prompts, _ragged_tree
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.packed import shared_prefix_log_probs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _cuda(tiny_model_dir, arch, dtype="float32", attn="sdpa"):
    loaded = load_model(
        ModelConfig(name_or_path=str(tiny_model_dir(arch)), dtype=dtype, attn_implementation=attn)
    )
    return loaded.model.to("cuda").eval(), loaded.adapter


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_flex_equals_sdpa_with_gradients_on_cuda(arch, dtype, atol, tiny_model_dir, tmp_path):
    """Compiled FlexAttention (block-sparse kernels, forward and backward) = the dense-mask SDPA pass."""
    sdpa, adapter = _cuda(tiny_model_dir, arch, dtype)
    flex, _ = _cuda(tiny_model_dir, arch, dtype, attn="flex_attention")
    tree = _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, k=3, m=3, seed=6)
    dense = shared_prefix_log_probs(sdpa, tree, [2, 0, 1], adapter.tokens)
    blocks = shared_prefix_log_probs(flex, tree, [2, 0, 1], adapter.tokens)
    torch.testing.assert_close(blocks.thought, dense.thought, atol=atol, rtol=0)
    torch.testing.assert_close(blocks.answer, dense.answer, atol=atol, rtol=0)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(x.shape, generator=g).cuda() for x in (dense.thought, dense.answer)]
    expected, got = weighted_grads(sdpa, dense, weights), weighted_grads(flex, blocks, weights)
    for e, s in zip(expected, got):
        if dtype == "float32":
            torch.testing.assert_close(s, e, atol=1e-5, rtol=1e-4)
        else:  # bf16 gradients: the same direction
            cos = torch.nn.functional.cosine_similarity(s.float().flatten(), e.float().flatten(), dim=0)
            assert cos > 0.99 or e.abs().max() < 1e-6, float(cos)


def test_packed_equals_naive_on_cuda(arch, tiny_model_dir, tmp_path):
    model, adapter = _cuda(tiny_model_dir, arch)
    assert_shared_equals_naive(
        model, _ragged_tree(_prompts(adapter, tmp_path), adapter.tokens, seed=2), [0, 1, 2], adapter.tokens
    )


def test_hf_rollout_reuses_the_kv_cache_on_cuda(tiny_model_dir, tmp_path):
    """Phase 2 from the expanded prompt + thought cache samples what recomputing the prefix samples, and its
    recorded log-probs are the packed pass's."""
    model, adapter = _cuda(tiny_model_dir, "qwen2_5_vl")
    prompts = _prompts(adapter, tmp_path)
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=3, max_thought_tokens=6, max_answer_tokens=5, seed=4
    )
    reused = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    recomputed = HFRolloutEngine.for_adapter(model, adapter, reuse_prefix_cache=False).sample(prompts, params)
    assert torch.equal(reused.thought_ids, recomputed.thought_ids)
    assert torch.equal(reused.answer_ids, recomputed.answer_ids)
    with torch.no_grad():
        packed = shared_prefix_log_probs(model, reused, [0, 1, 2], adapter.tokens)
    torch.testing.assert_close(packed.answer, reused.answer_logprobs * reused.answer_mask, atol=1e-4, rtol=0)


def test_bf16_grpo_ma_step_with_zero2_on_one_gpu(make_config, tiny_model_dir, tmp_path):
    from length_reward import AnswerLength  # noqa: F401

    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    data = generate_shapes("detection", 4, tmp_path / "data", seed=0, config=EASY)
    trainer = GRPOMATrainer(
        make_config(
            f"model.name_or_path={tiny_model_dir('qwen2_5_vl')}",
            f"data.train_path={data}",
            "deepspeed.precision=bf16",
            "deepspeed.zero_stage=2",
            "algorithm.kl_beta=0.1",
            "rewards.weights={test_answer_length: 1.0}",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.num_thoughts=2",
            "rollout.answers_per_thought=2",
        )
    )
    assert trainer.engine.dist.device.type == "cuda" and trainer.engine.precision == "bf16"
    (metrics,) = trainer.train()
    assert metrics["train/skipped_steps"] == 0 and 0 < metrics["train/grad_norm"] < math.inf
    assert metrics["rollout/logp_mismatch_mean"] < 0.05
