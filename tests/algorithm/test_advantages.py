"""GRPO-MA advantages against a test-local TRL GRPO reference and their defining properties."""

import pytest
import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages


def trl_grpo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL GRPOTrainer's formula on a flat reward vector grouped by prompt."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    std = grouped.std(dim=1).repeat_interleave(num_generations)
    return (rewards - mean) / (std + 1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_m1_equals_trl_grpo(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(6, 8, 1, generator=gen)
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    expected = trl_grpo_advantages(rewards.flatten(), 8).view(6, 8)
    torch.testing.assert_close(thought_adv, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(answer_adv[..., 0], expected, rtol=0, atol=1e-6)


def test_thought_and_answer_normalisation_match_definitions():
    rewards = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.0, 1.0]]])
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    values = torch.tensor([2 / 3, 0.0, 1.0, 0.5])
    expected_thought = (values - values.mean()) / (values.std() + 1e-4)
    flat = rewards.flatten()
    expected_answer = ((flat - flat.mean()) / (flat.std() + 1e-4)).view(1, 4, 3)
    torch.testing.assert_close(thought_adv[0], expected_thought)
    torch.testing.assert_close(answer_adv, expected_answer)


def test_groups_are_independent_per_prompt():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.rand(3, 4, 2, generator=gen)
    thought_all, answer_all = grpo_ma_advantages(rewards)
    thought_one, answer_one = grpo_ma_advantages(rewards[1:2] * 1.0)
    torch.testing.assert_close(thought_all[1:2], thought_one)
    torch.testing.assert_close(answer_all[1:2], answer_one)


@pytest.mark.parametrize("shift,scale", [(3.0, 1.0), (-2.0, 5.0), (0.0, 0.01)])
def test_std_scaling_is_shift_and_scale_invariant(shift, scale):
    gen = torch.Generator().manual_seed(2)
    rewards = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)
    base = grpo_ma_advantages(rewards, eps=0.0)
    moved = grpo_ma_advantages(rewards * scale + shift, eps=0.0)
    for a, b in zip(base, moved):
        torch.testing.assert_close(a, b)


def test_none_scaling_only_centres_and_is_shift_invariant():
    rewards = torch.tensor([[[1.0, 3.0], [2.0, 2.0]]])
    thought_adv, answer_adv = grpo_ma_advantages(rewards, scale="none")
    torch.testing.assert_close(thought_adv, torch.tensor([[0.0, 0.0]]))
    torch.testing.assert_close(answer_adv, torch.tensor([[[-1.0, 1.0], [0.0, 0.0]]]))
    shifted = grpo_ma_advantages(rewards + 10.0, scale="none")
    torch.testing.assert_close(shifted[1], answer_adv)


def test_zero_mean_per_group():
    gen = torch.Generator().manual_seed(3)
    thought_adv, answer_adv = grpo_ma_advantages(torch.rand(8, 6, 4, generator=gen))
    torch.testing.assert_close(thought_adv.sum(dim=1), torch.zeros(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(answer_adv.sum(dim=(1, 2)), torch.zeros(8), atol=1e-5, rtol=0)


@pytest.mark.parametrize("scale", ["std", "none"])
def test_degenerate_groups_give_exact_zero_not_nan(scale):
    rewards = torch.full((2, 4, 3), 0.1)  # 0.1 is not exactly representable: the mean may differ by an ulp
    rewards[1] = 1.0
    thought_adv, answer_adv = grpo_ma_advantages(rewards, scale=scale)
    assert torch.equal(thought_adv, torch.zeros(2, 4))
    assert torch.equal(answer_adv, torch.zeros(2, 4, 3))
    single = grpo_ma_advantages(torch.rand(2, 1, 1), scale=scale)
    assert torch.equal(single[0], torch.zeros(2, 1)) and torch.equal(single[1], torch.zeros(2, 1, 1))


def test_equal_thought_values_but_varied_answers():
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    assert torch.equal(thought_adv, torch.zeros(1, 2))
    assert answer_adv.abs().min() > 0.5


def test_rejects_wrong_shape_and_scale():
    with pytest.raises(ValueError, match=r"\[B, K, M\]"):
        grpo_ma_advantages(torch.rand(4, 4))
    with pytest.raises(ValueError, match="scale"):
        grpo_ma_advantages(torch.rand(1, 4, 2), scale="max")


def test_integer_rewards_are_accepted():
    thought_adv, _ = grpo_ma_advantages(torch.tensor([[[1], [0]]]))
    assert thought_adv.dtype == torch.float32 and thought_adv[0, 0] > 0


def test_permuted_equal_rewards_give_exactly_zero_thought_advantage():
    """Each thought holds the same five rewards in another order. Summed in float32 in answer order, the
    thought means differ in the last bit and normalising that gap by (std + eps) gave |A| ~ 1e-3; in float64
    over sorted answers they are bit-equal, so the advantage is exactly 0."""
    gen = torch.Generator().manual_seed(2)  # a draw whose float32 means differ in the last bit
    base = torch.rand(5, generator=gen)
    orders = [torch.randperm(5, generator=gen) for _ in range(8)]
    rewards = torch.stack([base[o] for o in orders]).unsqueeze(0)  # [1, 8, 5]
    float32_means = rewards.mean(dim=-1)
    assert float32_means.amax() > float32_means.amin()  # the float32 path would see a spread
    thought_adv, answer_adv = grpo_ma_advantages(rewards)
    assert torch.equal(thought_adv, torch.zeros(1, 8))
    flat = rewards.flatten().double()
    expected = ((flat - flat.mean()) / (flat.std() + 1e-4)).view(1, 8, 5)
    torch.testing.assert_close(answer_adv.double(), expected, rtol=0, atol=1e-6)


def test_statistics_are_float64_and_the_result_keeps_the_rewards_dtype():
    rewards = torch.rand(2, 3, 4, dtype=torch.float64)
    assert all(a.dtype == torch.float64 for a in grpo_ma_advantages(rewards))
    assert all(a.dtype == torch.float32 for a in grpo_ma_advantages(rewards.float()))
    # 3e38 rewards (near float32's limit): float32 squares overflowed; float64 normalises them like small ones
    huge = grpo_ma_advantages(rewards * 3e38, eps=0.0)
    small = grpo_ma_advantages(rewards, eps=0.0)
    for a, b in zip(huge, small):
        torch.testing.assert_close(a, b)
