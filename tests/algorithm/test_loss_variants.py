"""The stabilisers against formulas written from their sources: GSPO's sequence ratio, TRL's importance-sampling
correction, TRL's high-entropy mask, the thought weightings, and the registries the config offers."""

from __future__ import annotations

import typing

import pytest
import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.loss import (
    AGGREGATIONS,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    THOUGHT_WEIGHTINGS,
    Segments,
    grpo_ma_token_weights,
    policy_loss,
)
from vlm_grpoma.algorithm.rollout_correction import ROLLOUT_CORRECTIONS, rollout_correction
from vlm_grpoma.config import AlgorithmConfig, RolloutCorrectionConfig, load_config
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.trainer.logprobs import token_entropy
from vlm_grpoma.trainer.segments import high_entropy_mask

EPS_LOW, EPS_HIGH = 0.2, 0.28


def literal_choices(cls: type, name: str) -> tuple[str, ...]:
    return typing.get_args(typing.get_type_hints(cls)[name])


@pytest.mark.parametrize(
    "registry,cls,field",
    [
        (AGGREGATIONS, AlgorithmConfig, "loss_aggregation"),
        (KL_ESTIMATORS, AlgorithmConfig, "kl_estimator"),
        (IMPORTANCE_LEVELS, AlgorithmConfig, "importance_sampling_level"),
        (THOUGHT_WEIGHTINGS, AlgorithmConfig, "thought_weighting"),
    ],
)
def test_the_config_offers_exactly_the_registered_variants(registry, cls, field):
    assert set(literal_choices(cls, field)) == set(registry.names())


def test_the_config_offers_every_rollout_correction_and_auto():
    assert set(literal_choices(RolloutCorrectionConfig, "mode")) == {"auto", *ROLLOUT_CORRECTIONS.names()}
    assert RolloutCorrectionConfig().resolved_mode("vllm") == "tis"  # TRL's default for vLLM rollouts
    assert RolloutCorrectionConfig().resolved_mode("hf") == "none"
    assert RolloutCorrectionConfig(mode="mis").resolved_mode("hf") == "mis"


def test_trl_loss_type_names_are_answered_with_ours():
    with pytest.raises(ConfigError, match="TRL's loss_type 'dapo' is token_mean here"):
        load_config(None, ["algorithm.loss_aggregation=dapo"])
    with pytest.raises(ConfigError, match="'bnpo' normalises each micro-batch by its own token count"):
        load_config(None, ["algorithm.loss_aggregation=bnpo"])


def segments(seed: int, rows: int = 6, width: int = 5, *, level_noise: float = 0.3, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = torch.arange(width) < lengths[:, None]
    logp = -torch.rand(rows, width, generator=gen, dtype=dtype) * 2
    old = logp + (torch.rand(rows, width, generator=gen, dtype=dtype) - 0.5) * level_noise
    advantages = torch.randn(rows, generator=gen, dtype=dtype)
    weights = torch.rand(rows, generator=gen, dtype=dtype)
    return logp, old, mask, advantages, weights


def test_sequence_level_ratio_is_gspo_and_trls():
    """GSPO / TRL importance_sampling_level="sequence": exp(Σ_t m·(logp - old) / Σ_t m) for every token."""
    logp, old, mask, advantages, weights = segments(0)
    logp = logp.clone().requires_grad_(True)
    got = policy_loss(
        Segments(logp, mask, advantages, weights, old_logp=old),
        clip_eps_low=EPS_LOW,
        clip_eps_high=EPS_HIGH,
        kl_beta=0.0,
        importance_sampling_level="sequence",
    )
    got.loss.backward()

    reference_logp = logp.detach().clone().requires_grad_(True)
    m = mask.double()
    log_weights = ((reference_logp - old) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    coef_1 = torch.exp(log_weights).unsqueeze(-1)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token = -torch.min(coef_1 * advantages[:, None], coef_2 * advantages[:, None])
    expected = (per_token * m * weights[:, None]).sum()
    expected.backward()
    torch.testing.assert_close(got.loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logp.grad, reference_logp.grad, rtol=1e-10, atol=1e-12)
    # a sequence ratio clips whole segments: the clipped fraction is a fraction of segments' tokens
    assert 0 <= float(got.clip_fraction) <= 1


def test_token_level_is_unchanged_by_the_registry():
    logp, old, mask, advantages, weights = segments(1)
    ratio = torch.exp(logp - old)
    per_token = -torch.min(
        ratio * advantages[:, None], ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * advantages[:, None]
    )
    expected = (per_token * mask * weights[:, None]).sum()
    got = policy_loss(
        Segments(logp, mask, advantages, weights, old_logp=old),
        clip_eps_low=EPS_LOW,
        clip_eps_high=EPS_HIGH,
        kl_beta=0.0,
    )
    torch.testing.assert_close(got.loss, expected, rtol=1e-12, atol=1e-12)


def test_token_factors_scale_the_surrogate_and_not_the_kl():
    """TRL: per_token_loss = -min(...) * importance_sampling_ratio; then + β·KL."""
    logp, old, mask, advantages, weights = segments(2)
    ref = logp - 0.1
    factors = torch.rand(logp.shape, generator=torch.Generator().manual_seed(5), dtype=logp.dtype)
    base = dict(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=0.5)
    plain = policy_loss(Segments(logp, mask, advantages, weights, old_logp=old, ref_logp=ref), **base)
    scaled = policy_loss(
        Segments(logp, mask, advantages, weights, old_logp=old, ref_logp=ref, token_factors=factors), **base
    )
    ratio = torch.exp(logp - old)
    surrogate = -torch.min(
        ratio * advantages[:, None], ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * advantages[:, None]
    )
    expected_policy = (surrogate * factors * mask * weights[:, None]).sum()
    torch.testing.assert_close(scaled.policy_loss, expected_policy, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scaled.loss - scaled.policy_loss, plain.loss - plain.policy_loss)


def test_truncated_and_masked_importance_weights_follow_their_formulas():
    old = torch.log(
        torch.tensor([[0.5, 0.2, 0.9, 0.35], [0.6, 0.6, 0.1, 0.0]], dtype=torch.float64).clamp(min=1e-9)
    )
    rollout = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.6], [0.2, 0.6, 0.4, 1.0]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    ratio = torch.exp(old - rollout)  # 1, 4, 3, 7/12 | 3, 1, 0.25, (pad)
    cap = 2.0

    tis = rollout_correction(old, rollout, mask, "tis", "token", cap)
    torch.testing.assert_close(tis.factors, torch.where(mask, ratio.clamp(max=cap), 0.0))
    assert tis.clipped == 3 and tis.masked == 0 and tis.tokens == 7
    assert tis.ratio_max == pytest.approx(4.0)
    assert tis.ratio_sum == pytest.approx(1 + 4 + 3 + 7 / 12 + 3 + 1 + 0.25)

    # TRL's *_mask modes: is_ratio.masked_fill(is_ratio > cap, 0.0); the two-sided one also masks < 1/cap
    mis = rollout_correction(old, rollout, mask, "mis", "token", cap)
    torch.testing.assert_close(mis.factors, ratio.masked_fill(ratio > cap, 0.0).where(mask, 0.0))
    assert mis.masked == 3  # 4, 3 | 3 exceed 2
    two_sided = rollout_correction(old, rollout, mask, "mis_two_sided", "token", cap)
    outside = (ratio < 1 / cap) | (ratio > cap)
    torch.testing.assert_close(two_sided.factors, ratio.masked_fill(outside, 0.0).where(mask, 0.0))
    assert two_sided.masked == 4  # and 0.25 < 0.5

    # sequence level: one ratio per row, the product over its trained tokens (TRL's sequence_* modes)
    seq = rollout_correction(old, rollout, mask, "tis", "sequence", cap)
    products = [1 * 4 * 3 * 7 / 12, 3 * 1 * 0.25]
    expected = torch.tensor(
        [[min(products[0], cap)] * 4, [min(products[1], cap)] * 3 + [0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(seq.factors, expected)
    seq_mis = rollout_correction(old, rollout, mask, "mis", "sequence", cap)
    torch.testing.assert_close(  # 7 > 2 dropped; 0.75 kept as the weight it is
        seq_mis.factors, torch.tensor([[0.0] * 4, [0.75] * 3 + [0.0]], dtype=torch.float64)
    )

    none = rollout_correction(old, rollout, mask, "none", "token", cap)
    torch.testing.assert_close(none.factors, mask.double())
    with pytest.raises(ValueError, match="unknown rollout correction 'is'"):
        rollout_correction(old, rollout, mask, "is", "token", cap)


@pytest.mark.parametrize(
    ("mode", "level", "expected"),
    [
        ("mis", "token", [1.5, 0.8, 0.0]),  # the example: TRL keeps the weight, drops only 3.0 > cap
        ("mis_two_sided", "token", [1.5, 0.8, 0.0]),
        ("mis", "sequence", [1.2, 1.2, 0.0]),  # one ratio over (1.5, 0.8): 1.2
    ],
)
def test_masked_importance_sampling_keeps_the_weight_of_what_it_keeps(mode, level, expected):
    old = torch.log(torch.tensor([[1.5, 0.8, 3.0]], dtype=torch.float64))
    rollout = torch.zeros_like(old)
    mask = torch.tensor([[True, True, level == "token"]])
    factors = rollout_correction(old, rollout, mask, mode, level, cap=2.0).factors
    torch.testing.assert_close(factors, torch.tensor([expected], dtype=torch.float64))


def test_two_sided_masking_also_drops_ratios_below_one_over_the_cap():
    old = torch.log(torch.tensor([[0.4, 0.6, 2.5]], dtype=torch.float64))
    rollout, mask = torch.zeros_like(old), torch.ones_like(old, dtype=torch.bool)
    one_sided = rollout_correction(old, rollout, mask, "mis", "token", cap=2.0).factors
    two_sided = rollout_correction(old, rollout, mask, "mis_two_sided", "token", cap=2.0).factors
    torch.testing.assert_close(one_sided, torch.tensor([[0.4, 0.6, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(two_sided, torch.tensor([[0.0, 0.6, 0.0]], dtype=torch.float64))


def test_token_entropy_is_the_softmax_entropy():
    logits = torch.randn(3, 4, 17, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = logits.softmax(-1)
    expected = -(p * p.log()).sum(-1)
    torch.testing.assert_close(token_entropy(logits, rows=5), expected.float(), rtol=1e-6, atol=1e-6)
    differentiable = token_entropy(logits.clone().requires_grad_(True), differentiable=True)
    assert differentiable.requires_grad


def test_high_entropy_mask_is_trls_quantile_rule():
    gen = torch.Generator().manual_seed(3)
    entropies = [torch.rand(2, 5, generator=gen), torch.rand(2, 3, 4, generator=gen)]
    masks = [torch.rand(2, 5, generator=gen) > 0.2, torch.rand(2, 3, 4, generator=gen) > 0.2]
    fraction = 0.25
    kept = high_entropy_mask(entropies, masks, fraction)
    values = torch.cat([e[m] for e, m in zip(entropies, masks)])
    # TRL: quantile(non-pad entropies, 1 - top_entropy_quantile)
    threshold = torch.quantile(values, 1 - fraction)
    for e, m, k in zip(entropies, masks, kept):
        assert torch.equal(k.bool(), (e >= threshold) & m)
    share = sum(int(k.sum()) for k in kept) / values.numel()
    assert share == pytest.approx(fraction, abs=1 / values.numel() + 1e-9)


def test_entropy_bonus_adds_minus_c_times_weighted_entropy():
    logp, old, mask, advantages, weights = segments(4)
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=logp.dtype)
    base = dict(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, kl_beta=0.0)
    without = policy_loss(Segments(logp, mask, advantages, weights, old_logp=old), **base)
    with_bonus = policy_loss(
        Segments(logp, mask, advantages, weights, old_logp=old, entropy=entropy), entropy_coef=0.01, **base
    )
    expected = without.loss - 0.01 * (entropy * mask * weights[:, None]).sum()
    torch.testing.assert_close(with_bonus.loss, expected)
    with pytest.raises(ValueError, match="entropy_coef needs"):
        policy_loss(Segments(logp, mask, advantages, weights), entropy_coef=0.1, **base)


@pytest.mark.parametrize("weighting,factor", [("once", 1.0), ("per_answer", 4.0), ("sqrt_answers", 2.0)])
def test_thought_weighting_scales_thought_weights_by_1_m_or_sqrt_m(weighting, factor):
    t_len = torch.tensor([[3, 5]])
    a_len = torch.tensor([[[1, 2, 3, 4], [2, 2, 2, 2]]])
    once_t, once_a = grpo_ma_token_weights(t_len, a_len)
    got_t, got_a = grpo_ma_token_weights(t_len, a_len, thought_weighting=weighting)
    torch.testing.assert_close(got_t, once_t * factor)
    torch.testing.assert_close(got_a, once_a)


def test_token_mean_at_m_above_one_normalises_by_the_mean_path_length():
    """DAPO's token mean, hand-computed for B=1, K=2, M=2: path lengths (3+1, 3+3, 2+2, 2+4) → mean 5;
    a thought's weight is λ·(1/5)/(B·K), an answer's (1/5)/(B·K·M). Normalising by the distinct tokens instead
    (3+1+3 + 2+2+4 = 15 trained tokens over 2 thoughts, 7.5) would give 1/7.5 in place of 1/5."""
    t_len = torch.tensor([[3, 2]])
    a_len = torch.tensor([[[1, 3], [2, 4]]])
    t_w, a_w = grpo_ma_token_weights(t_len, a_len, aggregation="token_mean")
    torch.testing.assert_close(t_w, torch.full((1, 2), (1 / 5) / 2, dtype=torch.float64))
    torch.testing.assert_close(a_w, torch.full((1, 2, 2), (1 / 5) / 4, dtype=torch.float64))
    # all-ones per-token terms: each thought counted once, each answer over M — 1 in all, as DAPO's token mean
    total = float((t_w * t_len).sum() + (a_w * a_len).sum())
    assert total == pytest.approx((3 + 2) / 5 / 2 + (1 + 3 + 2 + 4) / 5 / 4) == pytest.approx(1.0)


def test_advantages_are_untouched_by_the_new_options():
    rewards = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(0))
    thought, answer = grpo_ma_advantages(rewards)
    assert thought.shape == (2, 3) and answer.shape == (2, 3, 2)
