"""The RolloutTree: for B prompts, K thoughts per prompt and M answers per thought.

Token tensors are right-padded with ``pad_id`` and come with a boolean mask of real tokens:
thoughts ``[B, K, Lt]``, answers ``[B, K, M, La]``. ``*_logprobs`` hold the log-probability of each token
under the distribution the sampling parameters name (``SamplingParams.logprob_temperature``: ``logits / T``
before top-k/top-p, or the raw logits), what a teacher-forced forward at that temperature returns; 0 at padding.
A thought always ends with the closing ``</think>`` tokens: either sampled (finish ``"stop"``) or appended
after the thought budget ran out (finish ``"length"``, ``thought_truncated`` set). Appended tokens were never
sampled: :meth:`RolloutTree.thought_loss_mask` leaves them out of training (they stay in the answers' context).

A ragged tree (adaptive answers: M_k answers for thought k) pads the M dimension and marks the sampled answers in
``answer_present [B, K, M]``; an absent answer has no tokens, an empty text and finish ``"stop"``, and the
present answers of a thought come first. ``answer_present=None`` is the uniform tree (every answer present).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from vlm_grpoma.models.base import PromptInputs

FinishReason = Literal["stop", "length"]


@dataclass
class RolloutTree:
    prompts: list[PromptInputs]
    pad_id: int
    thought_ids: torch.Tensor  # [B, K, Lt] long
    thought_mask: torch.Tensor  # [B, K, Lt] bool
    thought_logprobs: torch.Tensor  # [B, K, Lt] float
    thought_finish: list[list[FinishReason]]  # [B][K]
    # [B][K], decoded without special tokens (the think/answer tags are plain text)
    thought_texts: list[list[str]]
    answer_ids: torch.Tensor  # [B, K, M, La] long
    answer_mask: torch.Tensor  # [B, K, M, La] bool
    answer_logprobs: torch.Tensor  # [B, K, M, La] float
    answer_finish: list[list[list[FinishReason]]]  # [B][K][M]
    answer_texts: list[list[list[str]]]  # [B][K][M], end-of-turn tokens dropped
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase, as the backend measured it
    answer_present: torch.Tensor | None = None  # [B, K, M] bool, a ragged tree's sampled answers; None: all

    @property
    def present(self) -> torch.Tensor:
        """[B, K, M] bool: the sampled answers (all of them in a uniform tree)."""
        if self.answer_present is None:
            return torch.ones(self.shape, dtype=torch.bool)
        return self.answer_present

    @property
    def answer_counts(self) -> torch.Tensor:
        """[B, K] long: answers sampled after each thought (M_k)."""
        return self.present.sum(-1)

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
            answer_present=None if self.answer_present is None else self.answer_present[prompts],
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
            answer_present=(
                None
                if all(t.answer_present is None for t in trees)
                else torch.cat([t.present for t in trees])
            ),
        )

    def with_answers(self, more: RolloutTree, width: int) -> RolloutTree:
        """This tree's answers followed by ``more``'s (sampled after the same thoughts), ``width`` answer slots
        per thought, present answers first; phase times added (``more``'s phases as ``extra_<phase>``)."""
        if not torch.equal(more.thought_ids, self.thought_ids):
            raise ValueError("with_answers: the extra answers were sampled after other thoughts")
        answer_width = max(self.answer_ids.shape[-1], more.answer_ids.shape[-1])

        def joined(first: torch.Tensor, second: torch.Tensor, fill: float | int | bool) -> torch.Tensor:
            pad = torch.nn.functional.pad
            return torch.cat(
                [pad(v, (0, answer_width - v.shape[-1]), value=fill) for v in (first, second)], dim=2
            )

        present = torch.cat([self.present, more.present], dim=2)
        if int(present.sum(-1).max()) > width:
            raise ValueError(f"with_answers: more than {width} answers after a thought")
        # present answers first (stable), then the first ``width`` slots
        order = torch.argsort((~present).to(torch.int8), dim=-1, stable=True)[..., :width]
        batch, thoughts, slots = present.shape
        if slots < width:
            order = torch.cat([order, order.new_full((batch, thoughts, width - slots), slots)], dim=-1)

        def arranged(values: torch.Tensor, fill: float | int | bool) -> torch.Tensor:
            # slot ``slots`` is the fill: where an absent answer points
            padded = torch.nn.functional.pad(values, (0, 0, 0, 1), value=fill)
            return padded.gather(2, order.unsqueeze(-1).expand(-1, -1, -1, answer_width))

        def listed(first: list, second: list, fill: object) -> list:
            return [
                [
                    [(a + b + [fill])[i] for i in order[bi, ki].tolist()]
                    for ki, (a, b) in enumerate(zip(ra, rb))
                ]
                for bi, (ra, rb) in enumerate(zip(first, second))
            ]

        seconds = dict(self.seconds)
        for phase, value in more.seconds.items():
            seconds[f"extra_{phase}"] = seconds.get(f"extra_{phase}", 0.0) + value
        return replace(
            self,
            answer_ids=arranged(joined(self.answer_ids, more.answer_ids, self.pad_id), self.pad_id),
            answer_mask=arranged(joined(self.answer_mask, more.answer_mask, False), False),
            answer_logprobs=arranged(joined(self.answer_logprobs, more.answer_logprobs, 0.0), 0.0),
            answer_finish=listed(self.answer_finish, more.answer_finish, "stop"),
            answer_texts=listed(self.answer_texts, more.answer_texts, ""),
            seconds=seconds,
            answer_present=torch.nn.functional.pad(present, (0, 1), value=False).gather(2, order),
        )

    def thought_tokens(self, b: int, k: int) -> torch.Tensor:
        return self.thought_ids[b, k][self.thought_mask[b, k]]

    def answer_tokens(self, b: int, k: int, m: int) -> torch.Tensor:
        return self.answer_ids[b, k, m][self.answer_mask[b, k, m]]


def answers_at(
    tree: RolloutTree,
    slots: list[tuple[int, int]],
    width: int,
    *,
    ids: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor,
    finish: list[FinishReason],
    texts: list[str],
) -> RolloutTree:
    """A ragged tree of ``tree``'s thoughts and the answers sampled after them: answer row n (``ids``, ``mask``,
    ``logprobs`` ``[R, La]``; ``finish``, ``texts``) sits at ``slots[n] = (b·K + k, m)``, ``width`` slots per
    thought; the other slots are absent."""
    b, k, _ = tree.shape
    size = b * k * width
    flat = torch.tensor([i * width + j for i, j in slots], dtype=torch.long)
    answer_ids = torch.full((size, ids.shape[-1]), tree.pad_id, dtype=torch.long)
    answer_mask = torch.zeros((size, ids.shape[-1]), dtype=torch.bool)
    answer_logprobs = torch.zeros((size, ids.shape[-1]), dtype=logprobs.dtype)
    present = torch.zeros(size, dtype=torch.bool)
    answer_ids[flat], answer_mask[flat], answer_logprobs[flat], present[flat] = ids, mask, logprobs, True

    def placed(values: list, fill: object) -> list:
        rows = [[fill] * width for _ in range(b * k)]
        for (i, j), value in zip(slots, values, strict=True):
            rows[i][j] = value
        return [rows[i * k : (i + 1) * k] for i in range(b)]

    return replace(
        tree,
        seconds={},
        answer_ids=answer_ids.view(b, k, width, ids.shape[-1]),
        answer_mask=answer_mask.view(b, k, width, ids.shape[-1]),
        answer_logprobs=answer_logprobs.view(b, k, width, ids.shape[-1]),
        answer_finish=placed(finish, "stop"),
        answer_texts=placed(texts, ""),
        answer_present=present.view(b, k, width),
    )
