"""GRPO-MA advantages from a ``[B, K, M]`` reward tensor (see ``docs/architecture.md``, Algorithm).

Thought value ``V[b,k] = mean_m R[b,k,m]``; the thought advantage normalises V over the K thoughts of a prompt,
the answer advantage normalises R over all K·M rewards of the prompt. With M = 1 both equal GRPO's
``(r - mean) / (std + eps)`` (unbiased std, as TRL).

Statistics are computed in float64, and a thought's value sums its answers in sorted order, so thoughts whose
answers hold the same rewards in another order get bit-equal values and a group of equal values gets exactly 0
(in float32, permuted equal rewards reached |A| = 1.8e-3 over 8,000 random groups of 8 thoughts).

A reward without signal — NaN, ±inf, or beyond ``MAX_REWARD_MAGNITUDE`` in size, where float64 squares would
overflow — is left out of its group's mean and std and its answer gets advantage 0. A thought's value is the
mean of its usable answers; a thought with none is left out of the thought statistics and gets advantage 0.
TRL's GRPOTrainer (1.16: ``nanmean`` / ``nanstd`` per group, then ``nan_to_num(nan=0)``) leaves out only NaN
(a reward function returning None): there an ±inf reward makes its group's mean infinite and every advantage of
that group 0. We leave out ±inf (and overflowing rewards) like NaN, so one bad answer costs that answer only.

Unequal answers per thought (adaptive allocation, ``algorithm/allocation.py``) come as a padded M dimension with
an ``answer_mask [B, K, M]``: an absent answer is left out exactly like an unusable one, so a thought's value is
the mean of its own present answers, the answer advantage normalises over all present answers of the prompt, and
absent answers get advantage 0. Without a mask, or with an all-True one, the result is bit-identical. Where the
answer counts were chosen from the first answers' rewards, their plain mean is biased: the caller passes the
unbiased two-phase values instead (``allocation.TwoPhaseValues``).
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageScale = Literal["std", "none"]

#: Rewards larger in size carry no signal: 1e150² · 10⁶ answers per group stays below float64's 1.8e308.
MAX_REWARD_MAGNITUDE = 1e150


def usable_rewards(values: torch.Tensor) -> torch.Tensor:
    """Bool mask of the rewards that carry signal: finite and at most ``MAX_REWARD_MAGNITUDE`` in size."""
    return torch.isfinite(values) & (values.abs() <= MAX_REWARD_MAGNITUDE)


def group_normalise(
    values: torch.Tensor, *, scale: AdvantageScale = "std", eps: float = 1e-4
) -> torch.Tensor:
    """Normalise along the last dimension over its usable entries: ``(x - mean) / (std + eps)``, or only centre
    with ``scale="none"``; statistics in float64, the result in ``values``' dtype.

    Unusable entries (:func:`usable_rewards`) get 0, and so does every entry of a group with fewer than two
    usable values or whose usable values are all equal (never NaN).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    x = values.double()
    usable = usable_rewards(x)
    count = usable.sum(dim=-1, keepdim=True).double()
    mean = x.where(usable, 0.0).sum(dim=-1, keepdim=True) / count.clamp(min=1)
    centred = (x - mean).where(usable, 0.0)
    if scale == "std":
        std = ((centred**2).sum(dim=-1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std + eps)
    low = x.where(usable, torch.inf).amin(dim=-1, keepdim=True)
    high = x.where(usable, -torch.inf).amax(dim=-1, keepdim=True)
    no_signal = (count < 2) | (low == high) | ~usable
    return centred.masked_fill(no_signal, 0.0).to(values.dtype)


def grpo_ma_advantages(
    rewards: torch.Tensor,
    *,
    scale: AdvantageScale = "std",
    eps: float = 1e-4,
    answer_mask: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(thought_adv [B, K], answer_adv [B, K, M])`` for rewards ``[B, K, M]`` (unusable: no signal),
    in the rewards' floating dtype (float32 for integer rewards); ``answer_mask`` (bool ``[B, K, M]``) marks
    the present answers of a ragged tree (module docstring); ``values`` (``[B, K]``, NaN: none) replaces
    :func:`thought_values` (a two-phase tree's unbiased values, ``allocation.TwoPhaseValues``)."""
    if rewards.dim() != 3:
        raise ValueError(f"rewards must have shape [B, K, M], got {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if answer_mask is not None:
        check_answer_mask(answer_mask, rewards.shape)
        rewards = rewards.where(answer_mask, torch.nan)
    batch, thoughts, answers = rewards.shape
    if values is None:
        values = thought_values(rewards)
    elif values.shape != rewards.shape[:2]:
        raise ValueError(f"values must have shape {tuple(rewards.shape[:2])}, got {tuple(values.shape)}")
    thought_adv = group_normalise(values, scale=scale, eps=eps).to(rewards.dtype)
    answer_adv = group_normalise(rewards.reshape(batch, thoughts * answers), scale=scale, eps=eps)
    return thought_adv, answer_adv.reshape(batch, thoughts, answers)


def thought_values(rewards: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` float64 mean of each thought's usable answer rewards (NaN for a thought without any), summed
    in sorted order so that the value does not depend on the order of the answers."""
    x = rewards.double()
    usable = usable_rewards(x)
    total = x.where(usable, 0.0).sort(dim=-1).values.sum(dim=-1)
    count = usable.sum(dim=-1)
    return (total / count.clamp(min=1)).where(count > 0, torch.nan)


def check_answer_mask(answer_mask: torch.Tensor, shape: torch.Size) -> None:
    """Raise ``ValueError`` unless ``answer_mask`` is a bool tensor of the rewards' ``[B, K, M]`` shape."""
    if answer_mask.dtype != torch.bool or answer_mask.shape != shape:
        raise ValueError(
            f"answer_mask must be a bool tensor of shape {tuple(shape)}, got {answer_mask.dtype} "
            f"{tuple(answer_mask.shape)}"
        )
