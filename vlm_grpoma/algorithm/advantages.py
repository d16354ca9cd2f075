"""GRPO-MA advantages from a ``[B, K, M]`` reward tensor.

Thought value ``V[b,k] = mean_m R[b,k,m]``; the thought advantage normalises V over the K thoughts of a prompt,
the answer advantage normalises R over all K·M rewards of the prompt. With M = 1 both equal GRPO's
``(r - mean) / (std + eps)`` (unbiased std, as TRL).
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageScale = Literal["std", "none"]


def group_normalise(
    values: torch.Tensor, *, scale: AdvantageScale = "std", eps: float = 1e-4
) -> torch.Tensor:
    """Normalise along the last dimension: ``(x - mean) / (std + eps)``, or only centre with ``scale="none"``.

    A group with a single element, or whose values are all equal, gets exactly 0 (never NaN).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    size = values.shape[-1]
    if size < 2:
        return torch.zeros_like(values)
    centred = values - values.mean(dim=-1, keepdim=True)
    if scale == "std":
        centred = centred / (values.std(dim=-1, keepdim=True) + eps)
    constant = values.amax(dim=-1, keepdim=True) == values.amin(dim=-1, keepdim=True)
    return centred.masked_fill(constant, 0.0)


def grpo_ma_advantages(
    rewards: torch.Tensor, *, scale: AdvantageScale = "std", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(thought_adv [B, K], answer_adv [B, K, M])`` for rewards ``[B, K, M]``."""
    if rewards.dim() != 3:
        raise ValueError(f"rewards must have shape [B, K, M], got {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    batch, thoughts, answers = rewards.shape
    thought_adv = group_normalise(rewards.mean(dim=-1), scale=scale, eps=eps)
    answer_adv = group_normalise(rewards.reshape(batch, thoughts * answers), scale=scale, eps=eps)
    return thought_adv, answer_adv.reshape(batch, thoughts, answers)
