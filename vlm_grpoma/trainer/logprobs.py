"""Teacher-forced log-probs of a rollout tree's thought and answer tokens (the naive training pass).

Each (prompt, thought k, answer m) path is one left-padded row ``prompt + thought_k + answer_km``; a forward
over the rows gives every answer's log-probs, and the thought's from its first path (m = 0), so each thought
enters the loss once. The shared prefix is recomputed for every path here; the shared-prefix pass
(``trainer/packed.py``) removes that cost and is tested to reproduce these numbers.

Both passes score under the sampling distribution's temperature (``logits / T``, as TRL and verl do; the rollout
backends record their log-probs the same way) and can return each token's policy entropy from the same forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.models.base import (
    PromptInputs,
    SpecialTokens,
    collate,
    rope_index_owner,
    rope_positions,
    vision_inputs,
)
from vlm_grpoma.rollout.tree import RolloutTree


@dataclass
class PathLogProbs:
    """Log-probs aligned with the tree's padded token tensors for a subset of its prompts (0 at padding), and
    the policy's entropy at each token when asked for."""

    thought: torch.Tensor  # [b, K, Lt]
    answer: torch.Tensor  # [b, K, M, La]
    thought_entropy: torch.Tensor | None = None  # [b, K, Lt]
    answer_entropy: torch.Tensor | None = None  # [b, K, M, La]


@dataclass(frozen=True)
class ScoringOptions:
    """How a training pass scores tokens: the temperature dividing the logits, and whether to return entropy
    (``entropy_grad``: differentiable, for an entropy bonus; otherwise computed without grad, in chunks)."""

    temperature: float = 1.0
    entropy: bool = False
    entropy_grad: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"the scoring temperature must be > 0, got {self.temperature}")


#: teacher forcing on the raw logits, without entropy (SFT, and the tree contract's "raw" log-probs)
RAW_SCORING = ScoringOptions()


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / T`` in float32 (the distribution the rollout sampled from, before top-k/top-p)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` without materialising the full log-softmax: [..., V] -> [...]."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, *, differentiable: bool = False, rows: int = 256) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: [..., V] -> [...]; without grad it is computed ``rows``
    positions at a time, so it costs one chunk of vocabulary-sized memory, not a second copy of the logits."""

    def entropy(values: torch.Tensor) -> torch.Tensor:
        logp = values.float().log_softmax(-1)
        return -(logp.exp() * logp).sum(-1)

    if differentiable:
        return entropy(logits)
    with torch.no_grad():
        flat = logits.detach().reshape(-1, logits.shape[-1])
        parts = [entropy(flat[i : i + rows]) for i in range(0, flat.shape[0], rows)]
        return torch.cat(parts).view(logits.shape[:-1])


def completion_log_probs(
    model: torch.nn.Module,
    prompts: Sequence[PromptInputs],
    prompt_of_row: Sequence[int],
    completions: Sequence[torch.Tensor],
    tokens: SpecialTokens,
    options: ScoringOptions = RAW_SCORING,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[R, C]`` log-probs of each row's completion tokens given its prompt (left-aligned, 0 past the end),
    and their entropies when ``options.entropy``."""
    rows = [torch.cat([prompts[p].input_ids, c]) for p, c in zip(prompt_of_row, completions)]
    parameter = next(model.parameters())
    batch = {
        key: value.to(parameter.device)
        for key, value in collate(prompts, rows, prompt_of_row, tokens).items()
    }
    positions = rope_positions(rope_index_owner(model), batch)  # one rule with the rollout and packed pass
    batch |= vision_inputs(batch, parameter.device, parameter.dtype)  # absent for text-only prompts
    width = max(len(c) for c in completions)
    # Left padding: every completion ends at the last column; logits at column j predict token j + 1.
    logits = model(**batch, position_ids=positions, use_cache=False, logits_to_keep=width + 1).logits[:, :-1]
    logits = tempered(logits, options.temperature)
    right_aligned = token_log_probs(logits, batch["input_ids"][:, -width:])
    lengths = torch.tensor([len(c) for c in completions], device=parameter.device)
    # Shift each row left by its padding so completion token i sits in column i.
    columns = (torch.arange(width, device=parameter.device) + (width - lengths).unsqueeze(1)).clamp(
        max=width - 1
    )
    valid = torch.arange(width, device=parameter.device) < lengths.unsqueeze(1)
    entropy = None
    if options.entropy:
        entropy = token_entropy(logits, differentiable=options.entropy_grad).gather(1, columns) * valid
    return right_aligned.gather(1, columns) * valid, entropy


def path_log_probs(
    model: torch.nn.Module,
    tree: RolloutTree,
    prompt_indices: Sequence[int],
    tokens: SpecialTokens,
    options: ScoringOptions = RAW_SCORING,
) -> PathLogProbs:
    """Log-probs (with grad if enabled) of the thoughts and answers of ``prompt_indices``, one forward."""
    _, k_count, m_count = tree.shape
    b_count = len(prompt_indices)
    index = list(prompt_indices)
    present = tree.present[index].flatten()  # a ragged tree's absent answers get no row (and read as 0)
    owners, completions = [], []
    for b in prompt_indices:
        for k in range(k_count):
            thought = tree.thought_tokens(b, k)
            for m in range(m_count):
                if tree.present[b, k, m]:
                    owners.append(b)
                    completions.append(torch.cat([thought, tree.answer_tokens(b, k, m)]))
    per_path = completion_log_probs(model, tree.prompts, owners, completions, tokens, options)
    if not bool(present.all()):
        per_path = tuple(None if v is None else _scatter_rows(v, present) for v in per_path)
    thought_len = tree.thought_lengths[index].to(per_path[0].device)  # [b, K]
    lt, la = tree.thought_ids.shape[-1], tree.answer_ids.shape[-1]
    thought_mask = tree.thought_mask[index].to(thought_len.device)
    answer_mask = tree.answer_mask[index].to(thought_len.device)

    def split(values: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Thoughts from their first path (m = 0); answers start right after their thought."""
        if values is None:
            return None, None
        values = values.view(b_count, k_count, m_count, -1)
        thought = _take(values[:, :, 0], torch.zeros_like(thought_len), lt)
        answer = _take(values, thought_len.unsqueeze(-1).expand(-1, -1, m_count), la)
        return thought * thought_mask, answer * answer_mask

    (thought, answer), (thought_entropy, answer_entropy) = split(per_path[0]), split(per_path[1])
    return PathLogProbs(thought, answer, thought_entropy, answer_entropy)


def _scatter_rows(values: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``[P, C]`` rows of the present paths placed among all ``[len(present), C]`` paths (0 for the absent)."""
    rows = present.to(values.device).nonzero().flatten()
    return values.new_zeros((len(present), values.shape[1])).index_copy(0, rows, values)


def _take(values: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """``values[..., start:start + width]`` per leading index (columns past the end read as 0)."""
    padded = torch.nn.functional.pad(values, (0, width))
    columns = starts.unsqueeze(-1) + torch.arange(width, device=values.device)
    return padded.gather(-1, columns)
