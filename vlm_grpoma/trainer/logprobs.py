"""Teacher-forced log-probs of a rollout tree's thought and answer tokens (the naive training pass).

Each (prompt, thought k, answer m) path is one left-padded row ``prompt + thought_k + answer_km``; a forward
over the rows gives every answer's log-probs, and the thought's from its first path (m = 0), so each thought
enters the loss once. The shared prefix is recomputed for every path here; the shared-prefix pass
(``trainer/packed.py``) removes that cost and is tested to reproduce these numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.models.base import PromptInputs, SpecialTokens, collate
from vlm_grpoma.rollout.tree import RolloutTree


@dataclass
class PathLogProbs:
    """Log-probs aligned with the tree's padded token tensors for a subset of its prompts (0 at padding)."""

    thought: torch.Tensor  # [b, K, Lt]
    answer: torch.Tensor  # [b, K, M, La]


def log_normaliser(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits in fp32 and their log-sum-exp over the vocabulary, ``[..., V] -> ([..., V], [...])``.

    The one place both training passes turn logits into log-probs (``logp = logits[target] - lse``), in fp32
    whatever the model's dtype: a bf16 log-sum-exp over a large vocabulary loses ~1e-2 nats.
    """
    logits = logits.float()
    return logits, torch.logsumexp(logits, dim=-1)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` without materialising the full log-softmax: [..., V] -> [...]."""
    logits, lse = log_normaliser(logits)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse


def completion_log_probs(
    model: torch.nn.Module,
    prompts: Sequence[PromptInputs],
    prompt_of_row: Sequence[int],
    completions: Sequence[torch.Tensor],
    tokens: SpecialTokens,
) -> torch.Tensor:
    """``[R, C]`` log-probs of each row's completion tokens given its prompt (left-aligned, 0 past the end)."""
    rows = [torch.cat([prompts[p].input_ids, c]) for p, c in zip(prompt_of_row, completions)]
    parameter = next(model.parameters())
    batch = {
        key: value.to(parameter.device)
        for key, value in collate(prompts, rows, prompt_of_row, tokens).items()
    }
    batch["pixel_values"] = batch["pixel_values"].to(parameter.dtype)
    width = max(len(c) for c in completions)
    # Left padding: every completion ends at the last column; logits at column j predict token j + 1.
    logits = model(**batch, use_cache=False, logits_to_keep=width + 1).logits[:, :-1]
    right_aligned = token_log_probs(logits, batch["input_ids"][:, -width:])
    lengths = torch.tensor([len(c) for c in completions], device=parameter.device)
    # Shift each row left by its padding so completion token i sits in column i.
    columns = (torch.arange(width, device=parameter.device) + (width - lengths).unsqueeze(1)).clamp(
        max=width - 1
    )
    valid = torch.arange(width, device=parameter.device) < lengths.unsqueeze(1)
    return right_aligned.gather(1, columns) * valid


def path_log_probs(
    model: torch.nn.Module, tree: RolloutTree, prompt_indices: Sequence[int], tokens: SpecialTokens
) -> PathLogProbs:
    """Log-probs (with grad if enabled) of the thoughts and answers of ``prompt_indices``, one forward."""
    _, k_count, m_count = tree.shape
    b_count = len(prompt_indices)
    owners, completions = [], []
    for b in prompt_indices:
        for k in range(k_count):
            thought = tree.thought_tokens(b, k)
            for m in range(m_count):
                owners.append(b)
                completions.append(torch.cat([thought, tree.answer_tokens(b, k, m)]))
    logp = completion_log_probs(model, tree.prompts, owners, completions, tokens)
    logp = logp.view(b_count, k_count, m_count, -1)
    thought_len = tree.thought_lengths[list(prompt_indices)].to(logp.device)  # [b, K]
    lt, la = tree.thought_ids.shape[-1], tree.answer_ids.shape[-1]
    # Thoughts from their first path (m = 0); answers start right after their thought.
    thought = _take(logp[:, :, 0], torch.zeros_like(thought_len), lt)
    answer = _take(logp, thought_len.unsqueeze(-1).expand(-1, -1, m_count), la)
    return PathLogProbs(
        thought * tree.thought_mask[list(prompt_indices)].to(logp.device),
        answer * tree.answer_mask[list(prompt_indices)].to(logp.device),
    )


def _take(values: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """``values[..., start:start + width]`` per leading index (columns past the end read as 0)."""
    padded = torch.nn.functional.pad(values, (0, width))
    columns = starts.unsqueeze(-1) + torch.arange(width, device=values.device)
    return padded.gather(-1, columns)
