"""Token-level PPO-clip objective with a k3 KL penalty, over GRPO-MA thought and answer segments.

The KL penalty per token is Schulman's k3 estimator (``kl_estimator="k3"``) or k3 times the importance ratio
``π/π_old`` (``"k3_ratio"``), kept differentiable: on-policy its value is unchanged but its gradient gains
``k3·∇log π``. At M = 1 these are TRL GRPOTrainer's KL term with ``use_bias_correction_kl`` False and True.

A *segment* is the token span trained with one advantage: a thought (context: the prompt; advantage: the
thought advantage) or an answer (context: prompt + its thought; advantage: its own answer advantage).
Every segment carries one per-token weight, computed for the whole optimizer batch by
:func:`grpo_ma_token_weights`, so that the loss is a plain weighted token sum and micro-batches add up to the
full-batch loss exactly.

The GRPO-MA objective per prompt is ``λ·(1/K)·Σ_k J(thought_k) + (1/(K·M))·Σ_{k,m} J(answer_km)`` where
``J`` sums a segment's per-token terms divided by a length normaliser chosen by the aggregation mode. The
normaliser of the answer (k, m) is the length of its *path* (thought k followed by answer m) and the
thought's is the mean of its M path normalisers, so each thought counts once (not M times) and with M = 1
the objective is exactly GRPO's (per-sequence token mean), DAPO's (``token_mean``) or Dr. GRPO's
(``seq_mean_token_sum_norm``) over the concatenated completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k3", "k3_ratio"]


def grpo_ma_token_weights(
    thought_lengths: torch.Tensor,
    answer_lengths: torch.Tensor,
    *,
    aggregation: Aggregation = "seq_mean_token_mean",
    thought_loss_weight: float = 1.0,
    max_completion_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights ``(thought [B, K], answer [B, K, M])`` for one optimizer batch of B prompts.

    Lengths count the trained tokens of each segment. The weights include the ``1/B`` mean over prompts and
    are float64 (cast to the log-prob dtype in :func:`policy_loss`). Under data parallelism each rank passes its
    own batch, so ``token_mean`` normalises by that rank's mean path length (DAPO normalises by the global
    batch; the two agree when ranks' mean lengths do).
    """
    if (
        thought_lengths.dim() != 2
        or answer_lengths.dim() != 3
        or answer_lengths.shape[:2] != thought_lengths.shape
    ):
        raise ValueError(
            f"expected thought_lengths [B, K] and answer_lengths [B, K, M], got {tuple(thought_lengths.shape)} "
            f"and {tuple(answer_lengths.shape)}"
        )
    batch, thoughts, answers = answer_lengths.shape
    path_lengths = (thought_lengths.unsqueeze(-1) + answer_lengths).double().clamp(min=1.0)
    if aggregation == "seq_mean_token_mean":
        path_norm = 1.0 / path_lengths
    elif aggregation == "token_mean":
        path_norm = torch.full_like(path_lengths, 1.0 / path_lengths.mean().item())
    elif aggregation == "seq_mean_token_sum_norm":
        if not max_completion_tokens or max_completion_tokens < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_completion_tokens >= 1")
        path_norm = torch.full_like(path_lengths, 1.0 / max_completion_tokens)
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}")
    thought_weights = thought_loss_weight * path_norm.mean(dim=-1) / (batch * thoughts)
    answer_weights = path_norm / (batch * thoughts * answers)
    return thought_weights, answer_weights


@dataclass
class Segments:
    """A micro-batch of segments, right-padded to T tokens; ``mask`` marks the trained tokens."""

    logp: torch.Tensor  # [S, T] log-probs of the sampled tokens under the current policy (with grad)
    mask: torch.Tensor  # [S, T] bool
    advantages: torch.Tensor  # [S]
    token_weights: torch.Tensor  # [S]
    old_logp: torch.Tensor | None = None  # [S, T]; None: the sampling policy is the current one (μ = 1)
    ref_logp: torch.Tensor | None = None  # [S, T]; None: no KL term

    @classmethod
    def from_padded(
        cls,
        logp: torch.Tensor,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        token_weights: torch.Tensor,
        *,
        old_logp: torch.Tensor | None = None,
        ref_logp: torch.Tensor | None = None,
    ) -> Segments:
        """Segments from a rollout tree's padded layout: ``logp``/``mask``/``old``/``ref`` ``[..., T]`` and
        ``advantages``/``token_weights`` ``[...]`` (e.g. ``[b, K]`` thoughts or ``[b, K, M]`` answers), the
        leading dimensions flattened into S and everything moved to ``logp``'s device."""
        if (
            mask.shape != logp.shape
            or advantages.shape != logp.shape[:-1]
            or token_weights.shape != advantages.shape
        ):
            raise ValueError(
                f"segment shapes disagree: logp {tuple(logp.shape)}, mask {tuple(mask.shape)}, advantages "
                f"{tuple(advantages.shape)}, token_weights {tuple(token_weights.shape)}"
            )
        tokens, device = logp.shape[-1], logp.device

        def flat(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values.reshape(-1, tokens).to(device)

        return cls(
            logp=logp.reshape(-1, tokens),
            mask=flat(mask),
            advantages=advantages.reshape(-1).to(device),
            token_weights=token_weights.reshape(-1).to(device),
            old_logp=flat(old_logp),
            ref_logp=flat(ref_logp),
        )


@dataclass
class LossOutput:
    """The loss to backpropagate and its parts (detached) for logging."""

    loss: torch.Tensor
    policy_loss: torch.Tensor  # the weighted clipped-surrogate part of ``loss``
    kl: torch.Tensor  # weighted token mean of k3 (0 without reference log-probs)
    clip_fraction: torch.Tensor  # fraction of trained tokens whose clipped branch is active
    clip_low_fraction: torch.Tensor
    clip_high_fraction: torch.Tensor
    tokens: int


@dataclass
class LossStats:
    """Sums of :class:`LossOutput` parts over the micro-batches and policy epochs of one training step."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl_tokens: float = 0.0  # token-weighted: the sum of each output's mean KL times its tokens
    clipped_tokens: float = 0.0
    clipped_low_tokens: float = 0.0
    clipped_high_tokens: float = 0.0
    tokens: int = 0

    def add(self, output: LossOutput) -> None:
        tokens = output.tokens
        self.loss += float(output.loss.detach())
        self.policy_loss += float(output.policy_loss)
        self.kl_tokens += float(output.kl) * tokens
        self.clipped_tokens += float(output.clip_fraction) * tokens
        self.clipped_low_tokens += float(output.clip_low_fraction) * tokens
        self.clipped_high_tokens += float(output.clip_high_fraction) * tokens
        self.tokens += tokens

    def metrics(self, epochs: int) -> dict[str, float]:
        """Per-step losses (summed over micro-batches, averaged over the ``epochs`` optimizer steps) and
        per-token rates (over every trained token of every epoch)."""
        tokens = max(self.tokens, 1)
        return {
            "loss/total": self.loss / epochs,
            "loss/policy": self.policy_loss / epochs,
            "loss/kl": self.kl_tokens / tokens,
            "loss/clip_fraction": self.clipped_tokens / tokens,
            "loss/clip_low_fraction": self.clipped_low_tokens / tokens,
            "loss/clip_high_fraction": self.clipped_high_tokens / tokens,
        }


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π || π_ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` (≥ 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def policy_loss(
    segments: Segments,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    kl_beta: float,
    kl_estimator: KLEstimator = "k3",
) -> LossOutput:
    """Per token ``-min(r·A, clip(r, 1-ε_low, 1+ε_high)·A) + β·KL``, weighted and summed over trained tokens.

    ``KL`` is ``k3`` or, with ``kl_estimator="k3_ratio"``, ``r·k3`` (``r`` the importance ratio, with grad).
    """
    if kl_estimator not in ("k3", "k3_ratio"):
        raise ValueError(f"kl_estimator must be 'k3' or 'k3_ratio', got {kl_estimator!r}")
    logp, mask = segments.logp, segments.mask.to(segments.logp.dtype)
    old_logp = logp.detach() if segments.old_logp is None else segments.old_logp
    advantages = segments.advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)
    weights = segments.token_weights.to(logp.dtype).unsqueeze(-1) * mask
    policy_part = (per_token * weights).sum()

    use_kl = kl_beta > 0 and segments.ref_logp is not None
    if use_kl:
        kl_per_token = k3_kl(logp, segments.ref_logp)
        if kl_estimator == "k3_ratio":
            kl_per_token = kl_per_token * ratio
        kl_part = (kl_per_token * weights).sum()
        loss = policy_part + kl_beta * kl_part
        kl_mean = kl_part.detach() / weights.sum().clamp(min=torch.finfo(logp.dtype).tiny)
    else:
        loss = policy_part
        kl_mean = torch.zeros((), dtype=logp.dtype)

    with torch.no_grad():
        trained = mask.bool()
        low = (ratio < 1.0 - clip_eps_low) & (advantages < 0) & trained
        high = (ratio > 1.0 + clip_eps_high) & (advantages > 0) & trained
        count = max(int(trained.sum()), 1)
        return LossOutput(
            loss=loss,
            policy_loss=policy_part.detach(),
            kl=kl_mean,
            clip_fraction=(low | high).sum() / count,
            clip_low_fraction=low.sum() / count,
            clip_high_fraction=high.sum() / count,
            tokens=int(trained.sum()),
        )
