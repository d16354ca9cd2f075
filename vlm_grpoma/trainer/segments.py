"""From a rollout tree and a micro-batch's log-probs to the thought and answer :class:`Segments` the loss trains.

Each segment gets its advantage and loss weight (:class:`SegmentTargets`, computed once for the optimizer batch),
its trained-token mask (a truncated thought's appended ``</think>`` tokens are never trained), and its token
factors: the rollout correction ``π_old/π_rollout`` and the high-entropy mask. What those factors did is counted
in :class:`SegmentStats` for the step's metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlm_grpoma.algorithm import Segments
from vlm_grpoma.algorithm.rollout_correction import Correction, rollout_correction
from vlm_grpoma.config import AlgorithmConfig
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logprobs import PathLogProbs


@dataclass(frozen=True)
class SegmentTargets:
    """What each segment of an optimizer batch is trained towards, and which of its tokens are trained."""

    thought_adv: torch.Tensor  # [B, K]
    answer_adv: torch.Tensor  # [B, K, M]
    thought_weights: torch.Tensor  # [B, K]
    answer_weights: torch.Tensor  # [B, K, M]
    thought_mask: torch.Tensor  # [B, K, Lt] the sampled thought tokens (RolloutTree.thought_loss_mask)


@dataclass
class SegmentStats:
    """Sums over the micro-batches of the first policy epoch: entropy, rollout-correction ratios and factors."""

    entropy: dict[str, float] = field(default_factory=lambda: {"thought": 0.0, "answer": 0.0})
    entropy_tokens: dict[str, int] = field(default_factory=lambda: {"thought": 0, "answer": 0})
    ratio_sum: float = 0.0
    ratio_max: float = 0.0
    clipped: int = 0
    masked: int = 0
    corrected_tokens: int = 0
    entropy_masked: int = 0
    trained_tokens: int = 0

    def add_correction(self, correction: Correction) -> None:
        self.ratio_sum += correction.ratio_sum
        self.ratio_max = max(self.ratio_max, correction.ratio_max)
        self.clipped += correction.clipped
        self.masked += correction.masked
        self.corrected_tokens += correction.tokens

    def add_entropy(self, kind: str, entropy: torch.Tensor | None, mask: torch.Tensor) -> None:
        self.trained_tokens += int(mask.sum())
        if entropy is not None:
            self.entropy[kind] += float(entropy.detach()[mask].sum())
            self.entropy_tokens[kind] += int(mask.sum())

    def metrics(self, correction_mode: str) -> dict[str, float]:
        metrics = {
            f"entropy/{kind}_mean": self.entropy[kind] / max(self.entropy_tokens[kind], 1)
            for kind in ("thought", "answer")
        }
        if correction_mode != "none":
            tokens = max(self.corrected_tokens, 1)
            metrics |= {
                "rollout_correction/ratio_mean": self.ratio_sum / tokens,
                "rollout_correction/ratio_max": self.ratio_max,
                "rollout_correction/clipped_fraction": self.clipped / tokens,
                "rollout_correction/masked_fraction": self.masked / tokens,
            }
        metrics["entropy/masked_fraction"] = self.entropy_masked / max(self.trained_tokens, 1)
        return metrics


def high_entropy_mask(
    entropies: list[torch.Tensor], masks: list[torch.Tensor], fraction: float
) -> list[torch.Tensor]:
    """1 at the trained tokens whose entropy is at least the (1 - ``fraction``) quantile of all the trained
    tokens given (thoughts and answers of one micro-batch together), else 0 — TRL's ``get_high_entropy_mask``."""
    values = torch.cat([e.detach()[m].float() for e, m in zip(entropies, masks)])
    if values.numel() == 0:
        return [torch.zeros_like(e) for e in entropies]
    threshold = torch.quantile(values, 1.0 - fraction)
    return [((e.detach() >= threshold) & m).to(e.dtype) for e, m in zip(entropies, masks)]


@dataclass
class _Part:
    """One kind of segment (thoughts or answers) of a micro-batch, in the tree's padded layout."""

    logp: torch.Tensor
    mask: torch.Tensor
    rollout_logp: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    entropy: torch.Tensor | None
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    factors: torch.Tensor | None = None

    def segments(self) -> Segments:
        return Segments.from_padded(
            self.logp,
            self.mask,
            self.advantages,
            self.weights,
            old_logp=self.old_logp,
            ref_logp=self.ref_logp,
            token_factors=self.factors,
            entropy=self.entropy,
        )

    def scale(self, factors: torch.Tensor) -> None:
        self.factors = factors if self.factors is None else self.factors * factors


def micro_batch_segments(
    tree: RolloutTree,
    chunk: list[int],
    logp: PathLogProbs,
    targets: SegmentTargets,
    old: PathLogProbs | None,
    ref: PathLogProbs | None,
    algorithm: AlgorithmConfig,
    correction_mode: str,
    stats: SegmentStats | None,
) -> tuple[Segments, Segments]:
    """The thought and the answer segments of the prompts ``chunk``; ``stats`` (first epoch only) counts what the
    token factors did."""
    device = logp.thought.device
    parts = {
        "thought": _Part(
            logp.thought,
            targets.thought_mask[chunk].to(device),
            tree.thought_logprobs[chunk],
            targets.thought_adv[chunk],
            targets.thought_weights[chunk],
            logp.thought_entropy,
            None if old is None else old.thought,
            None if ref is None else ref.thought,
        ),
        "answer": _Part(
            logp.answer,
            tree.answer_mask[chunk].to(device),
            tree.answer_logprobs[chunk],
            targets.answer_adv[chunk],
            targets.answer_weights[chunk],
            logp.answer_entropy,
            None if old is None else old.answer,
            None if ref is None else ref.answer,
        ),
    }
    if correction_mode != "none":
        settings = algorithm.rollout_correction
        for part in parts.values():
            before = part.logp if part.old_logp is None else part.old_logp
            correction = rollout_correction(
                before, part.rollout_logp, part.mask, correction_mode, settings.level, settings.cap
            )
            part.scale(correction.factors)
            if stats is not None:
                stats.add_correction(correction)
    if algorithm.top_entropy_fraction < 1:
        kept = high_entropy_mask(
            [p.entropy for p in parts.values()],
            [p.mask for p in parts.values()],
            algorithm.top_entropy_fraction,
        )
        for part, keep in zip(parts.values(), kept):
            part.scale(keep)
            if stats is not None:
                stats.entropy_masked += int((part.mask & (keep == 0)).sum())
    if stats is not None:
        for kind, part in parts.items():
            stats.add_entropy(kind, part.entropy, part.mask)
    return parts["thought"].segments(), parts["answer"].segments()
