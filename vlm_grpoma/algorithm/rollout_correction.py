"""Correction for the rollout/trainer log-prob mismatch: importance weights ``π_old / π_rollout`` per token.

``π_old`` is the trainer's own log-prob of a sampled token before the update, ``π_rollout`` the one the rollout
backend recorded while sampling it (both under the same tempered distribution). A vLLM engine in bf16 differs
from the trainer by kernel and precision effects, so its samples are slightly off-policy; the correction
reweights each token's surrogate term (not its KL):

- ``tis`` (truncated importance sampling, TRL's ``token_truncate``/``sequence_truncate``): ``min(ρ, cap)``;
- ``mis`` (masked importance sampling, TRL's ``token_mask``/``sequence_mask``): ``ρ · 1[ρ ≤ cap]``, the
  weight kept and a token (or with ``level="sequence"`` the whole segment) whose ratio exceeds the cap dropped;
- ``mis_two_sided``: ``ρ · 1[1/cap ≤ ρ ≤ cap]`` (verl's MIS presets; TRL's mask modes with a lower clip), also
  dropping tokens the rollout backend found far likelier than the trainer does;
- ``none``: 1.

A dropped token stays in the loss normaliser (its factor is 0), as in TRL.

``level="token"`` uses each token's ratio; ``"sequence"`` one ratio per segment, ``exp(Σ_t log ρ_t)`` over its
trained tokens (thought and answer segments separately), as TRL's sequence modes do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlm_grpoma.algorithm.registry import Registry

#: token factors [S, T] from (ratio [S, T], cap)
ROLLOUT_CORRECTIONS: Registry[Callable[[torch.Tensor, float], torch.Tensor]] = Registry("rollout correction")
CORRECTION_LEVELS = ("token", "sequence")


@ROLLOUT_CORRECTIONS.register("none")
def _no_correction(ratio: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.ones_like(ratio)


@ROLLOUT_CORRECTIONS.register("tis")
def _truncated(ratio: torch.Tensor, cap: float) -> torch.Tensor:
    return ratio.clamp(max=cap)


@ROLLOUT_CORRECTIONS.register("mis")
def _masked(ratio: torch.Tensor, cap: float) -> torch.Tensor:
    return ratio.where(ratio <= cap, 0.0)


@ROLLOUT_CORRECTIONS.register("mis_two_sided")
def _masked_two_sided(ratio: torch.Tensor, cap: float) -> torch.Tensor:
    return ratio.where((ratio >= 1.0 / cap) & (ratio <= cap), 0.0)


@dataclass(frozen=True)
class Correction:
    """Token factors for :class:`~vlm_grpoma.algorithm.loss.Segments` and what they did, over trained tokens."""

    factors: torch.Tensor  # [..., T], 0 at padding
    ratio_sum: float
    ratio_max: float
    clipped: int  # trained tokens whose ratio exceeded the cap (their factor is the cap under tis)
    masked: int  # trained tokens whose factor is 0 (mis, mis_two_sided)
    tokens: int


def rollout_correction(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str, level: str, cap: float
) -> Correction:
    """Importance factors of the trained tokens ``mask [..., T]`` (``old``/``rollout`` log-probs alike)."""
    if level not in CORRECTION_LEVELS:
        raise ValueError(
            f"unknown rollout-correction level {level!r}; choose from {', '.join(CORRECTION_LEVELS)}"
        )
    correct = ROLLOUT_CORRECTIONS[mode]
    with torch.no_grad():
        trained = mask.to(old_logp.device, torch.bool)
        log_ratio = (old_logp.detach().double() - rollout_logp.to(old_logp.device).double()) * trained
        if level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
        ratio = torch.exp(log_ratio)
        factors = correct(ratio, cap).where(trained, 0.0)
        seen = ratio[trained]
        return Correction(
            factors=factors.to(old_logp.dtype),
            ratio_sum=float(seen.sum()),
            ratio_max=float(seen.max()) if seen.numel() else 0.0,
            clipped=int((seen > cap).sum()),
            masked=int((factors[trained] == 0).sum()),
            tokens=int(seen.numel()),
        )
