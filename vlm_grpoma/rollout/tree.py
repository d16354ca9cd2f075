"""The RolloutTree: for B prompts, K thoughts per prompt and M answers per thought.

Token tensors are right-padded with ``pad_id`` and come with a boolean mask of real tokens:
thoughts ``[B, K, Lt]``, answers ``[B, K, M, La]``. ``*_logprobs`` hold the log-probability of each token
under the distribution the sampling parameters name (``SamplingParams.logprob_temperature``: ``logits / T``
before top-k/top-p, or the raw logits), what a teacher-forced forward at that temperature returns; 0 at padding.
A thought always ends with the closing ``</think>`` tokens: either sampled (finish ``"stop"``) or appended
after the thought budget ran out (finish ``"length"``, ``thought_truncated`` set). Appended tokens were never
sampled: :meth:`RolloutTree.thought_loss_mask` leaves them out of training (they stay in the answers' context).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch

from vlm_grpoma.models.base import PromptInputs

FinishReason = Literal["stop", "length"]


@dataclass
class Segment:
    """One training segment: ``tokens`` [T] to score given ``context`` [C] (ids only; images via prompt_index)."""

    prompt_index: int
    thought_index: int
    answer_index: int | None
    context: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor


@dataclass
class RolloutTree:
    prompts: list[PromptInputs]
    pad_id: int
    thought_ids: torch.Tensor  # [B, K, Lt] long
    thought_mask: torch.Tensor  # [B, K, Lt] bool
    thought_logprobs: torch.Tensor  # [B, K, Lt] float
    thought_finish: list[list[FinishReason]]  # [B][K]
    thought_texts: list[
        list[str]
    ]  # [B][K], decoded without special tokens (the think/answer tags are plain text)
    answer_ids: torch.Tensor  # [B, K, M, La] long
    answer_mask: torch.Tensor  # [B, K, M, La] bool
    answer_logprobs: torch.Tensor  # [B, K, M, La] float
    answer_finish: list[list[list[FinishReason]]]  # [B][K][M]
    answer_texts: list[list[list[str]]]  # [B][K][M], end-of-turn tokens dropped
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase, as the backend measured it

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, K, M)."""
        b, k, m, _ = self.answer_ids.shape
        return b, k, m

    @property
    def thought_truncated(self) -> torch.Tensor:
        """[B, K] bool: thoughts closed by force after their budget ran out."""
        return torch.tensor([[f == "length" for f in row] for row in self.thought_finish], dtype=torch.bool)

    @property
    def answer_truncated(self) -> torch.Tensor:
        """[B, K, M] bool: answers cut by the answer budget."""
        return torch.tensor(
            [[[f == "length" for f in ans] for ans in row] for row in self.answer_finish], dtype=torch.bool
        )

    def thought_loss_mask(self, closing_tokens: int) -> torch.Tensor:
        """[B, K, Lt] bool: the sampled thought tokens, i.e. ``thought_mask`` without the ``closing_tokens``
        appended to each truncated thought."""
        mask = self.thought_mask.clone()
        if closing_tokens:
            lengths = self.thought_lengths
            columns = torch.arange(mask.shape[-1])
            appended = (
                columns >= (lengths - closing_tokens).unsqueeze(-1)
            ) & self.thought_truncated.unsqueeze(-1)
            mask &= ~appended
        return mask

    @property
    def thought_lengths(self) -> torch.Tensor:
        return self.thought_mask.sum(-1)

    @property
    def answer_lengths(self) -> torch.Tensor:
        return self.answer_mask.sum(-1)

    def completions(self) -> list[list[list[str]]]:
        """[B][K][M] full completion texts, thought + answer (what format rewards score)."""
        return [
            [[self.thought_texts[b][k] + a for a in answers] for k, answers in enumerate(row)]
            for b, row in enumerate(self.answer_texts)
        ]

    def select(self, prompts: list[int]) -> RolloutTree:
        """The sub-tree of the prompts ``prompts`` (in that order), padding kept."""
        return RolloutTree(
            prompts=[self.prompts[b] for b in prompts],
            pad_id=self.pad_id,
            thought_ids=self.thought_ids[prompts],
            thought_mask=self.thought_mask[prompts],
            thought_logprobs=self.thought_logprobs[prompts],
            thought_finish=[self.thought_finish[b] for b in prompts],
            thought_texts=[self.thought_texts[b] for b in prompts],
            answer_ids=self.answer_ids[prompts],
            answer_mask=self.answer_mask[prompts],
            answer_logprobs=self.answer_logprobs[prompts],
            answer_finish=[self.answer_finish[b] for b in prompts],
            answer_texts=[self.answer_texts[b] for b in prompts],
            seconds=dict(self.seconds),
        )

    @staticmethod
    def concatenate(trees: list[RolloutTree]) -> RolloutTree:
        """The trees' prompts one after another (same K and M), right-padded to the widest; phase times added."""
        thought_width = max(t.thought_ids.shape[-1] for t in trees)
        answer_width = max(t.answer_ids.shape[-1] for t in trees)

        def stack(parts: list[torch.Tensor], width: int, fill: float | int | bool) -> torch.Tensor:
            return torch.cat(
                [torch.nn.functional.pad(v, (0, width - v.shape[-1]), value=fill) for v in parts]
            )

        seconds: dict[str, float] = {}
        for tree in trees:
            for phase, value in tree.seconds.items():
                seconds[phase] = seconds.get(phase, 0.0) + value
        pad_id = trees[0].pad_id
        return RolloutTree(
            prompts=[p for t in trees for p in t.prompts],
            pad_id=pad_id,
            thought_ids=stack([t.thought_ids for t in trees], thought_width, pad_id),
            thought_mask=stack([t.thought_mask for t in trees], thought_width, False),
            thought_logprobs=stack([t.thought_logprobs for t in trees], thought_width, 0.0),
            thought_finish=[row for t in trees for row in t.thought_finish],
            thought_texts=[row for t in trees for row in t.thought_texts],
            answer_ids=stack([t.answer_ids for t in trees], answer_width, pad_id),
            answer_mask=stack([t.answer_mask for t in trees], answer_width, False),
            answer_logprobs=stack([t.answer_logprobs for t in trees], answer_width, 0.0),
            answer_finish=[row for t in trees for row in t.answer_finish],
            answer_texts=[row for t in trees for row in t.answer_texts],
            seconds=seconds,
        )

    def thought_tokens(self, b: int, k: int) -> torch.Tensor:
        return self.thought_ids[b, k][self.thought_mask[b, k]]

    def answer_tokens(self, b: int, k: int, m: int) -> torch.Tensor:
        return self.answer_ids[b, k, m][self.answer_mask[b, k, m]]

    def thought_segments(self) -> Iterator[Segment]:
        """B·K segments: thought tokens in the context of the prompt (order b, k)."""
        b_, k_, _ = self.shape
        for b in range(b_):
            for k in range(k_):
                mask = self.thought_mask[b, k]
                yield Segment(
                    b,
                    k,
                    None,
                    self.prompts[b].input_ids,
                    self.thought_ids[b, k][mask],
                    self.thought_logprobs[b, k][mask],
                )

    def answer_segments(self) -> Iterator[Segment]:
        """B·K·M segments: answer tokens in the context of prompt + thought (order b, k, m)."""
        b_, k_, m_ = self.shape
        for b in range(b_):
            for k in range(k_):
                context = torch.cat([self.prompts[b].input_ids, self.thought_tokens(b, k)])
                for m in range(m_):
                    mask = self.answer_mask[b, k, m]
                    yield Segment(
                        b, k, m, context, self.answer_ids[b, k, m][mask], self.answer_logprobs[b, k, m][mask]
                    )
