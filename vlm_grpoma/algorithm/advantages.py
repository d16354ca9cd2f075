"""GRPO-MA advantages from a ``[B, K, M]`` reward tensor (see ``docs/architecture.md``, Algorithm).

Thought value ``V[b,k] = mean_m R[b,k,m]``; the thought advantage normalises V over the K thoughts of a prompt,
the answer advantage normalises R over all K·M rewards of the prompt. With M = 1 both equal GRPO's
``(r - mean) / (std + eps)`` (unbiased std, as TRL).

A non-finite reward (a reward function that could not score an answer) carries no signal: it is left out of
its group's mean and std and its answer gets advantage 0, as TRL GRPOTrainer does for a completion that no
reward function could score. A thought's value is the mean of its finite answers; a thought with none is left
out of the thought statistics and gets advantage 0.
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageScale = Literal["std", "none"]


def group_normalise(
    values: torch.Tensor, *, scale: AdvantageScale = "std", eps: float = 1e-4
) -> torch.Tensor:
    """Normalise along the last dimension over its finite entries: ``(x - mean) / (std + eps)``, or only centre
    with ``scale="none"``.

    Non-finite entries get 0, and so does every entry of a group with fewer than two finite values or whose
    finite values are all equal (never NaN).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    finite = torch.isfinite(values)
    if bool(finite.all()):  # the common case, in torch's own reductions
        count = torch.full_like(values[..., :1], values.shape[-1])
        mean = values.mean(dim=-1, keepdim=True)
        std = values.std(dim=-1, keepdim=True) if values.shape[-1] > 1 else torch.zeros_like(mean)
        low, high = values.amin(dim=-1, keepdim=True), values.amax(dim=-1, keepdim=True)
    else:
        count = finite.sum(dim=-1, keepdim=True).to(values.dtype)
        kept = values.where(finite, 0.0)
        mean = kept.sum(dim=-1, keepdim=True) / count.clamp(min=1)
        squares = ((values - mean).where(finite, 0.0) ** 2).sum(dim=-1, keepdim=True)
        std = (squares / (count - 1).clamp(min=1)).sqrt()
        low = values.where(finite, torch.inf).amin(dim=-1, keepdim=True)
        high = values.where(finite, -torch.inf).amax(dim=-1, keepdim=True)
    centred = values - mean
    if scale == "std":
        centred = centred / (std + eps)
    no_signal = (count < 2) | (low == high) | ~finite
    return centred.masked_fill(no_signal, 0.0)


def grpo_ma_advantages(
    rewards: torch.Tensor, *, scale: AdvantageScale = "std", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(thought_adv [B, K], answer_adv [B, K, M])`` for rewards ``[B, K, M]`` (NaN/inf: no signal)."""
    if rewards.dim() != 3:
        raise ValueError(f"rewards must have shape [B, K, M], got {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    batch, thoughts, answers = rewards.shape
    thought_adv = group_normalise(thought_values(rewards), scale=scale, eps=eps)
    answer_adv = group_normalise(rewards.reshape(batch, thoughts * answers), scale=scale, eps=eps)
    return thought_adv, answer_adv.reshape(batch, thoughts, answers)


def thought_values(rewards: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` mean of each thought's finite answer rewards (NaN for a thought without any)."""
    finite = torch.isfinite(rewards)
    if bool(finite.all()):
        return rewards.mean(dim=-1)
    return rewards.where(finite, 0.0).sum(dim=-1) / finite.sum(dim=-1).where(finite.any(dim=-1), 0)
