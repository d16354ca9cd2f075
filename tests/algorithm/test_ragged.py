"""Unequal answers per thought (a padded M with an answer mask): advantages and token weights against loop
references, against the truncated uniform tree, and bit-identical to the uniform path with an all-True mask."""

import itertools
import math

import pytest
import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.loss import AGGREGATIONS, THOUGHT_WEIGHTINGS, grpo_ma_token_weights


def rewards_with_bad_values(seed, batch=5, thoughts=4, answers=6):
    """Random rewards with NaN, ±inf, repeated values and a prompt whose thoughts permute equal rewards."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (batch, thoughts, answers), generator=gen).float() / 2
    rewards = rewards + (torch.rand(rewards.shape, generator=gen) < 0.5) * torch.rand(
        rewards.shape, generator=gen
    )
    bad = torch.rand(rewards.shape, generator=gen)
    rewards[bad < 0.05] = torch.nan
    rewards[(bad >= 0.05) & (bad < 0.08)] = torch.inf
    rewards[(bad >= 0.08) & (bad < 0.1)] = -torch.inf
    base = torch.rand(answers, generator=gen)
    rewards[0] = torch.stack([base[torch.randperm(answers, generator=gen)] for _ in range(thoughts)])
    return rewards


def ragged_mask(seed, batch=5, thoughts=4, answers=6, low=1):
    """A mask keeping M_k ∈ [low, answers] answers of each thought, at random positions."""
    gen = torch.Generator().manual_seed(seed + 100)
    counts = torch.randint(low, answers + 1, (batch, thoughts), generator=gen)
    order = torch.rand(batch, thoughts, answers, generator=gen).argsort(dim=-1)
    return order < counts.unsqueeze(-1)


def normalise_reference(values, eps=1e-4):
    """(x − mean) / (std + eps) over the finite values of a list (unbiased std), 0 for no signal."""
    usable = [v for v in values if math.isfinite(v)]
    if len(usable) < 2 or min(usable) == max(usable):
        return [0.0] * len(values)
    mean = sum(usable) / len(usable)
    std = math.sqrt(sum((v - mean) ** 2 for v in usable) / (len(usable) - 1))
    return [(v - mean) / (std + eps) if math.isfinite(v) else 0.0 for v in values]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", ["std", "none"])
def test_all_true_mask_is_bit_identical_to_no_mask(seed, scale):
    rewards = rewards_with_bad_values(seed)
    for dtype in (torch.float32, torch.float64):
        plain = grpo_ma_advantages(rewards.to(dtype), scale=scale)
        masked = grpo_ma_advantages(
            rewards.to(dtype), scale=scale, answer_mask=torch.ones(rewards.shape, dtype=torch.bool)
        )
        for a, b in zip(plain, masked):
            assert torch.equal(a.nan_to_num(), b.nan_to_num()) and not a.isnan().any()
    assert torch.equal(plain[0][0], torch.zeros(4, dtype=torch.float64))  # permuted equal rewards: exactly 0


@pytest.mark.parametrize("seed", range(4))
def test_ragged_advantages_match_a_loop_reference(seed):
    rewards = rewards_with_bad_values(seed).double()
    mask = ragged_mask(seed)
    thought_adv, answer_adv = grpo_ma_advantages(rewards, answer_mask=mask)
    for b in range(rewards.shape[0]):
        values = []
        for k in range(rewards.shape[1]):
            own = [float(r) for r, present in zip(rewards[b, k], mask[b, k]) if present and math.isfinite(r)]
            values.append(sum(own) / len(own) if own else math.nan)
        expected = torch.tensor(normalise_reference(values), dtype=torch.float64)
        torch.testing.assert_close(thought_adv[b], expected, rtol=0, atol=1e-9)
        present = [float(r) if m else math.nan for r, m in zip(rewards[b].flatten(), mask[b].flatten())]
        expected = torch.tensor(normalise_reference(present), dtype=torch.float64).view(mask[b].shape)
        torch.testing.assert_close(answer_adv[b], expected, rtol=0, atol=1e-9)
    assert torch.equal(answer_adv[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


def test_equal_counts_in_a_wider_padding_equal_the_truncated_tree():
    gen = torch.Generator().manual_seed(7)
    rewards = torch.rand(3, 4, 6, generator=gen)
    mask = torch.zeros(3, 4, 6, dtype=torch.bool)
    mask[..., :4] = True
    ragged = grpo_ma_advantages(rewards, answer_mask=mask)
    uniform = grpo_ma_advantages(rewards[..., :4])
    assert torch.equal(ragged[0], uniform[0])
    torch.testing.assert_close(ragged[1][..., :4], uniform[1], rtol=0, atol=1e-6)


def test_permuted_equal_present_rewards_give_exactly_zero_at_unequal_padding():
    gen = torch.Generator().manual_seed(2)
    base = torch.rand(5, generator=gen)
    rewards = torch.rand(1, 6, 8, generator=gen)  # absent slots hold noise that must be ignored
    mask = torch.zeros(1, 6, 8, dtype=torch.bool)
    for k in range(6):
        slots = torch.randperm(8, generator=gen)[:5]
        rewards[0, k, slots] = base[torch.randperm(5, generator=gen)]
        mask[0, k, slots] = True
    thought_adv, _ = grpo_ma_advantages(rewards, answer_mask=mask)
    assert torch.equal(thought_adv, torch.zeros(1, 6))


def test_a_thought_without_present_answers_gets_zero_and_is_left_out():
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]])
    mask = torch.tensor([[[True, True], [False, False], [True, False]]])
    thought_adv, answer_adv = grpo_ma_advantages(rewards, answer_mask=mask)
    expected = normalise_reference([0.5, math.nan, 1.0])
    torch.testing.assert_close(thought_adv[0], torch.tensor(expected))
    assert answer_adv[0, 1].eq(0).all() and answer_adv[0, 2, 1] == 0


def test_answer_mask_must_be_bool_of_the_rewards_shape():
    with pytest.raises(ValueError, match="answer_mask"):
        grpo_ma_advantages(torch.rand(1, 2, 3), answer_mask=torch.ones(1, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="answer_mask"):
        grpo_ma_advantages(torch.rand(1, 2, 3), answer_mask=torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="answer_mask"):
        grpo_ma_token_weights(
            torch.ones(1, 2), torch.ones(1, 2, 3), answer_mask=torch.ones(1, 2, 2, dtype=torch.bool)
        )


def random_lengths(seed, batch=3, thoughts=4, answers=5):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(1, 9, (batch, thoughts), generator=gen),
        torch.randint(1, 6, (batch, thoughts, answers), generator=gen),
    )


CASES = list(itertools.product(AGGREGATIONS.names(), THOUGHT_WEIGHTINGS.names()))


@pytest.mark.parametrize("aggregation,weighting", CASES)
def test_all_true_mask_reproduces_the_uniform_weights_exactly(aggregation, weighting):
    t_len, a_len = random_lengths(0)
    kwargs = dict(
        aggregation=aggregation,
        thought_weighting=weighting,
        thought_loss_weight=0.7,
        max_completion_tokens=16,
    )
    plain = grpo_ma_token_weights(t_len, a_len, **kwargs)
    masked = grpo_ma_token_weights(
        t_len, a_len, answer_mask=torch.ones(a_len.shape, dtype=torch.bool), **kwargs
    )
    assert all(torch.equal(a, b) for a, b in zip(plain, masked))


@pytest.mark.parametrize("aggregation,weighting", CASES)
def test_equal_counts_in_a_wider_padding_weigh_like_the_truncated_tree(aggregation, weighting):
    t_len, a_len = random_lengths(1)
    mask = torch.zeros(a_len.shape, dtype=torch.bool)
    mask[..., :3] = True
    kwargs = dict(
        aggregation=aggregation,
        thought_weighting=weighting,
        thought_loss_weight=0.7,
        max_completion_tokens=16,
    )
    t_w, a_w = grpo_ma_token_weights(t_len, a_len, answer_mask=mask, **kwargs)
    t_ref, a_ref = grpo_ma_token_weights(t_len, a_len[..., :3], **kwargs)
    torch.testing.assert_close(t_w, t_ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(a_w[..., :3], a_ref, rtol=1e-12, atol=0)
    assert a_w[..., 3:].eq(0).all()


def test_ragged_weights_match_the_written_objective():
    """seq_mean_token_mean: answer (k, m) weighs 1/(len_km·B·K·M_k), thought k λ·w(M_k)·mean_m(1/len_km)/(B·K);
    each thought's answers hold one thought's worth of weight whatever M_k."""
    t_len, a_len = random_lengths(2)
    mask = ragged_mask(2, batch=3, thoughts=4, answers=5)
    t_w, a_w = grpo_ma_token_weights(
        t_len, a_len, answer_mask=mask, thought_weighting="sqrt_answers", thought_loss_weight=0.5
    )
    batch, thoughts, _ = a_len.shape
    for b, k in itertools.product(range(batch), range(thoughts)):
        paths = [int(t_len[b, k] + a_len[b, k, m]) for m in range(5) if mask[b, k, m]]
        count = len(paths)
        expected_t = 0.5 * math.sqrt(count) * sum(1 / p for p in paths) / count / (batch * thoughts)
        assert t_w[b, k].item() == pytest.approx(expected_t, rel=1e-12)
        present = a_w[b, k][mask[b, k]]
        expected_a = torch.tensor([1 / (p * batch * thoughts * count) for p in paths], dtype=torch.float64)
        torch.testing.assert_close(present, expected_a, rtol=1e-12, atol=0)
        path_weight = (present * torch.tensor(paths, dtype=torch.float64)).sum().item()
        assert path_weight == pytest.approx(1 / (batch * thoughts), rel=1e-12)
    assert a_w[~mask].eq(0).all()


def test_token_mean_normalises_by_the_present_paths_only():
    t_len, a_len = random_lengths(3)
    mask = ragged_mask(3, batch=3, thoughts=4, answers=5)
    a_len = a_len.masked_fill(~mask, 1000)  # absent answers' lengths must not move the batch normaliser
    _, a_w = grpo_ma_token_weights(t_len, a_len, answer_mask=mask, aggregation="token_mean")
    paths = (t_len.unsqueeze(-1) + a_len).double()[mask]
    counts = mask.sum(-1, keepdim=True).double().expand_as(a_w)[mask]
    torch.testing.assert_close(a_w[mask], 1 / (paths.mean() * 12 * counts), rtol=1e-12, atol=0)
