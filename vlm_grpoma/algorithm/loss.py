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
(``seq_mean_token_sum_norm``) over the concatenated completion. ``thought_weighting`` scales the thought
term for comparison with other implementations: ``once`` (the above), ``per_answer`` (×M: a thought repeated in
each of its M sequences, as a naive K·M-sequence implementation trains it) or ``sqrt_answers`` (×√M: TreeRL's
1/√n down-weighting of a segment shared by n leaves, applied to the M-fold repetition).

Importance ratio: per token (``importance_sampling_level="token"``, PPO/GRPO) or, as GSPO defines it, one ratio
per segment ``exp(mean_t (log π - log π_old))`` broadcast over its tokens (``"sequence"``; thought and answer
segments each have their own). ``Segments.token_factors`` multiply each token's clipped-surrogate term (not the
KL), as TRL applies its vLLM importance-sampling weights and its high-entropy mask. ``entropy_coef`` adds
``-c·H`` per token with the same weights (verl's ``entropy_coeff``).

TRL's ``bnpo`` loss type (each micro-batch normalised by its own token count) has no counterpart: its gradient
depends on how the batch is split into micro-batches, which this design rules out (micro-batches add up to the
batch loss). Without gradient accumulation it equals ``token_mean`` (= TRL's ``dapo``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlm_grpoma.algorithm.registry import Registry

#: path normaliser [B, K, M] of each aggregation, from the path lengths (float64) and the completion budget
AGGREGATIONS: Registry[Callable[[torch.Tensor, int | None], torch.Tensor]] = Registry("loss aggregation")
#: KL(π || π_ref) per token from (logp, ref_logp, importance ratio)
KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = Registry(
    "KL estimator"
)
#: log importance weight [S, T] from (log π - log π_old [S, T], trained-token mask [S, T] float)
IMPORTANCE_LEVELS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry(
    "importance-sampling level"
)
#: the factor on a thought's weight, from M (answers per thought)
THOUGHT_WEIGHTINGS: Registry[Callable[[int], float]] = Registry("thought weighting")


@AGGREGATIONS.register("seq_mean_token_mean")
def _per_path_mean(path_lengths: torch.Tensor, max_completion_tokens: int | None) -> torch.Tensor:
    """GRPO: each path's token mean."""
    return 1.0 / path_lengths


@AGGREGATIONS.register("token_mean")
def _batch_token_mean(path_lengths: torch.Tensor, max_completion_tokens: int | None) -> torch.Tensor:
    """DAPO (TRL ``dapo``): every trained token of the batch alike, over the batch's mean path length."""
    return torch.full_like(path_lengths, 1.0 / path_lengths.mean().item())


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def _budget_sum(path_lengths: torch.Tensor, max_completion_tokens: int | None) -> torch.Tensor:
    """Dr. GRPO: token sums over the completion budget."""
    if not max_completion_tokens or max_completion_tokens < 1:
        raise ValueError("seq_mean_token_sum_norm needs max_completion_tokens >= 1")
    return torch.full_like(path_lengths, 1.0 / max_completion_tokens)


@THOUGHT_WEIGHTINGS.register("once")
def _once(answers: int) -> float:
    return 1.0


@THOUGHT_WEIGHTINGS.register("per_answer")
def _per_answer(answers: int) -> float:
    return float(answers)


@THOUGHT_WEIGHTINGS.register("sqrt_answers")
def _sqrt_answers(answers: int) -> float:
    return math.sqrt(answers)


def grpo_ma_token_weights(
    thought_lengths: torch.Tensor,
    answer_lengths: torch.Tensor,
    *,
    aggregation: str = "seq_mean_token_mean",
    thought_loss_weight: float = 1.0,
    max_completion_tokens: int | None = None,
    thought_weighting: str = "once",
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
    path_norm = AGGREGATIONS[aggregation](path_lengths, max_completion_tokens)
    thought_loss_weight *= THOUGHT_WEIGHTINGS[thought_weighting](answers)
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
    # [S, T] detached factors on each token's surrogate term (rollout correction, entropy mask); None: 1
    token_factors: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # [S, T] policy entropy per token; needed when entropy_coef > 0

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
        token_factors: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
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
            token_factors=flat(token_factors),
            entropy=flat(entropy),
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


@KL_ESTIMATORS.register("k3")
def _k3(logp: torch.Tensor, ref_logp: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """TRL with ``use_bias_correction_kl=False``."""
    return k3_kl(logp, ref_logp)


@KL_ESTIMATORS.register("k3_ratio")
def _k3_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """k3 times the importance ratio, differentiable (TRL's ``use_bias_correction_kl=True``)."""
    return k3_kl(logp, ref_logp) * ratio


@IMPORTANCE_LEVELS.register("token")
def _token_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return log_ratio


@IMPORTANCE_LEVELS.register("sequence")
def _sequence_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: the length-normalised log-ratio of the whole segment, on each of its tokens."""
    per_segment = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return per_segment.expand_as(log_ratio)


def policy_loss(
    segments: Segments,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
    kl_beta: float,
    kl_estimator: str = "k3",
    importance_sampling_level: str = "token",
    entropy_coef: float = 0.0,
) -> LossOutput:
    """Per token ``-f·min(r·A, clip(r, 1-ε_low, 1+ε_high)·A) + β·KL - c·H``, weighted and summed over trained
    tokens (``f`` the segment's token factors, ``r`` the importance ratio at the configured level)."""
    estimate_kl = KL_ESTIMATORS[kl_estimator]
    log_weight = IMPORTANCE_LEVELS[importance_sampling_level]
    logp, mask = segments.logp, segments.mask.to(segments.logp.dtype)
    old_logp = logp.detach() if segments.old_logp is None else segments.old_logp
    advantages = segments.advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(log_weight(logp - old_logp, mask))
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)
    if segments.token_factors is not None:
        per_token = per_token * segments.token_factors.to(logp.dtype)
    weights = segments.token_weights.to(logp.dtype).unsqueeze(-1) * mask
    policy_part = (per_token * weights).sum()
    loss = policy_part

    use_kl = kl_beta > 0 and segments.ref_logp is not None
    kl_mean = torch.zeros((), dtype=logp.dtype)
    if use_kl:
        kl_part = (estimate_kl(logp, segments.ref_logp, ratio) * weights).sum()
        loss = loss + kl_beta * kl_part
        kl_mean = kl_part.detach() / weights.sum().clamp(min=torch.finfo(logp.dtype).tiny)
    if entropy_coef:
        if segments.entropy is None:
            raise ValueError("entropy_coef needs the segments' entropy")
        loss = loss - entropy_coef * (segments.entropy.to(logp.dtype) * weights).sum()

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
