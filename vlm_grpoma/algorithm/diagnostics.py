"""Training diagnostics: the gradient spike score and thought-advantage variance estimates.

GSS, as SPAM (Huang et al., 2025, "SPAM: Spike-Aware Adam with Momentum Reset") defines it, on the global
gradient norm before clipping: ``GSS_t = ‖g_t‖ / mean_{s=1..T} ‖g_s‖`` against the mean over the whole run of T
steps; GSS@10 counts the steps whose score exceeds 10. Both are known only when the run ends
(:meth:`GradientSpikeTracker.run_metrics`). The online signal logged every step, ``gss_running``, divides by the
mean of the steps so far instead; it is not the paper's quantity (the first steps can never count: a norm of 50
at step 6 after norms of 1 scores 5.45 online, 33.6 against a 100-step run's mean).

The thought-advantage variance is the noise that answer sampling puts into a thought's advantage; GRPO-MA's
theory says it has a floor in K and decays like 1/M: ``Var(A_k) → σ_k² / (M·τ² + σ̄²)`` as K → ∞.

Training/inference mismatch: a rollout engine's recorded log-probs ``q_t`` and the trainer's teacher-forced
``p_t`` for the same tokens differ by kernel and precision effects (large for vLLM in bf16, ~0 for ``hf``);
:func:`logprob_mismatch` reports ``mean |p_t - q_t|`` and the largest such difference over real tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vlm_grpoma.algorithm.allocation import TwoPhaseValues


@dataclass
class GradientSpikeTracker:
    """Every step's gradient norm, the running score of each, and the run's GSS at the end (module docstring).

    Non-finite norms are ignored (those steps are skipped). A state saved before ``norms`` existed resumes the
    running score; the run's GSS then covers the steps since the resume.
    """

    threshold: float = 10.0
    #: steps counted in the running mean
    steps: int = 0
    norm_sum: float = 0.0
    #: steps whose running score exceeded the threshold
    spikes: int = 0
    #: the finite norm of every step so far, for the run's GSS
    norms: list[float] = field(default_factory=list)

    def update(self, grad_norm: float) -> float:
        """Record one step's gradient norm and return its running score (NaN for a non-finite norm)."""
        grad_norm = float(grad_norm)
        if not math.isfinite(grad_norm):
            return math.nan
        self.steps += 1
        self.norm_sum += grad_norm
        self.norms.append(grad_norm)
        mean = self.norm_sum / self.steps
        score = grad_norm / mean if mean > 0 else 0.0
        if score > self.threshold:
            self.spikes += 1
        return score

    def run_scores(self) -> list[float]:
        """SPAM's GSS of every recorded step, against the mean norm of all of them (0 when that mean is 0)."""
        mean = math.fsum(self.norms) / len(self.norms) if self.norms else 0.0
        return [norm / mean if mean > 0 else 0.0 for norm in self.norms]

    def run_metrics(self) -> dict[str, float]:
        """The run's ``train/gss_max``, ``train/gss10_count`` and ``train/gss10_fraction`` (SPAM's GSS@10 with
        ``threshold`` 10), for the final step's metrics and the summary line."""
        scores = self.run_scores()
        count = sum(score > self.threshold for score in scores)
        return {
            "train/gss_max": max(scores, default=0.0),
            "train/gss10_count": float(count),
            "train/gss10_fraction": count / len(scores) if scores else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, list(value) if key == "norms" else value)


def thought_advantage_variance(
    rewards: torch.Tensor,
    answer_mask: torch.Tensor | None = None,
    two_phase: TwoPhaseValues | None = None,
) -> torch.Tensor:
    """Per-prompt estimate ``[B]`` of the answer-sampling variance of the thought advantages, averaged over K.

    Plugs the within-thought variances s_k² and the between-thought variance of the true values
    (τ² = Var_k(V̂_k) − mean(s²)/M, clipped at 0) into the large-K limit ``mean_k s_k² / (M·τ² + mean s²)``.
    (A bootstrap over answers was tried and rejected: resampling inflates the denominator's spread too and
    underestimates by 20–30 % at M ≤ 8.) Needs M ≥ 2; returns NaN for M = 1, where nothing measures it.

    A ragged tree (``answer_mask [B, K, M]``, M_k answers for thought k, each ≥ 2) uses each thought's own
    value variance ``s_k² c_k``: ``mean_k(s_k² c_k) / (τ² + mean_k(s_k² c_k))`` with ``c_k = 1/M_k`` for the
    plain mean, the same number when every M_k = M, or ``two_phase``'s factor and values for a two-phase tree.
    """
    if rewards.dim() != 3:
        raise ValueError(f"rewards must have shape [B, K, M], got {tuple(rewards.shape)}")
    if two_phase is not None or (answer_mask is not None and not bool(answer_mask.all())):
        mask = torch.ones_like(rewards, dtype=torch.bool) if answer_mask is None else answer_mask
        return _ragged_thought_advantage_variance(rewards.double(), mask, two_phase)
    rewards = rewards.double()
    batch, _, answers = rewards.shape
    if answers < 2:
        return torch.full((batch,), math.nan, dtype=torch.float64)
    within = rewards.var(dim=-1).mean(dim=-1)
    between = (rewards.mean(dim=-1).var(dim=-1) - within / answers).clamp(min=0.0)
    denominator = answers * between + within
    return torch.where(denominator > 0, within / denominator.clamp(min=1e-300), torch.zeros_like(within))


def _ragged_thought_advantage_variance(
    rewards: torch.Tensor, answer_mask: torch.Tensor, two_phase: TwoPhaseValues | None
) -> torch.Tensor:
    """:func:`thought_advantage_variance` of a ragged tree: the thoughts' own answer counts and values."""
    counts = answer_mask.sum(-1)
    total = counts.double()
    mean = rewards.where(answer_mask, 0.0).sum(-1) / total.clamp(min=1.0)
    squares = ((rewards - mean.unsqueeze(-1)).where(answer_mask, 0.0) ** 2).sum(-1)
    factor = 1.0 / total.clamp(min=1.0) if two_phase is None else two_phase.variance_factor(counts)
    value = mean if two_phase is None else two_phase.values(rewards, answer_mask)
    noise = (squares / (total - 1.0).clamp(min=1.0) * factor).mean(-1)  # mean_k s_k² Var(V_k)/σ_k²
    between = (value.var(dim=-1) - noise).clamp(min=0.0)
    denominator = between + noise
    return torch.where(denominator > 0, noise / denominator.clamp(min=1e-300), torch.zeros_like(noise))


@dataclass(frozen=True)
class LogProbMismatch:
    """``mean_abs`` / ``max_abs`` of ``trainer - rollout`` log-probs over ``tokens`` real tokens."""

    mean_abs: float
    max_abs: float
    tokens: int

    def metrics(self, prefix: str = "rollout/logp_mismatch") -> dict[str, float]:
        return {f"{prefix}_mean": self.mean_abs, f"{prefix}_max": self.max_abs}


def logprob_mismatch(pairs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> LogProbMismatch:
    """Mismatch over ``(trainer_logp, rollout_logp, mask)`` triples of matching shapes (e.g. the thought and
    the answer tensors of a micro-batch: ``PathLogProbs.thought`` vs ``tree.thought_logprobs[chunk]``)."""
    diffs = []
    for trainer, rollout, mask in pairs:
        if trainer.shape != rollout.shape or trainer.shape != mask.shape:
            raise ValueError(
                f"log-prob shapes differ: trainer {tuple(trainer.shape)}, rollout "
                f"{tuple(rollout.shape)}, mask {tuple(mask.shape)}"
            )
        mask = mask.to(trainer.device, torch.bool)
        diffs.append((trainer.detach().float() - rollout.to(trainer.device).float())[mask].abs())
    flat = torch.cat(diffs) if diffs else torch.zeros(0)
    if flat.numel() == 0:
        return LogProbMismatch(0.0, 0.0, 0)
    return LogProbMismatch(float(flat.mean()), float(flat.max()), int(flat.numel()))
