"""Micro-batches of a rank's prompts: a fixed count per micro-batch (``train.micro_batch_prompts``) or packed by
a token budget (``train.micro_batch_tokens``), as verl, EasyR1 and OpenRLHF do, so long prompts cannot OOM a GPU.

A micro-batch's cost is what its forward holds: its rows padded to the longest, ``rows x longest`` tokens
(shared pass: one packed row per prompt; naive pass: K x M path rows per prompt). The loss weights every token
against the whole batch, so the micro-batch losses sum to the batch loss however the prompts are grouped;
only memory and speed depend on the grouping. Every rank must run the same number of micro-batches (ZeRO
reduces gradients each backward), so the counts are equalised by splitting the largest micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlm_grpoma.config import TrainConfig
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logging import reduce_metrics


def row_tokens(tree: RolloutTree, logprob_pass: str) -> tuple[list[int], int]:
    """(tokens of each prompt's longest row, rows per prompt) of the log-prob pass over ``tree``.

    ``shared``: one packed row, prompt + every thought + every answer; ``naive``: K x M rows of prompt + thought
    + answer (the longest path counts, as the rows are padded to it; a ragged tree's present answers only).
    """
    _, k_count, m_count = tree.shape
    prompt = torch.tensor([len(p.input_ids) for p in tree.prompts])
    if logprob_pass == "shared":
        branch = tree.thought_lengths.sum(1) + tree.answer_lengths.sum((1, 2))
        return (prompt + branch).tolist(), 1
    path = (tree.thought_lengths[:, :, None] + tree.answer_lengths).flatten(1).amax(1)
    return (prompt + path).tolist(), int(
        tree.answer_counts.sum(1).max()
    ) if tree.prompts else k_count * m_count


def fixed_count(n_prompts: int, size: int) -> list[list[int]]:
    """Consecutive groups of ``size`` prompts (``train.micro_batch_prompts``)."""
    return [list(range(i, min(i + size, n_prompts))) for i in range(0, n_prompts, size)]


def token_budget(lengths: Sequence[int], rows_per_prompt: int, budget: int) -> list[list[int]]:
    """Prompts grouped so that no group's ``prompts x rows_per_prompt x longest`` exceeds ``budget`` tokens.

    Longest first, each group filled while the next (shorter) prompt fits, so groups hold similar lengths and
    pad little. A prompt over the budget on its own gets a micro-batch of its own (it cannot be split).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * rows_per_prompt * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` split (the largest first, in halves) until there are ``count`` of them; costs only shrink,
    so a budget still holds. ``count`` must not exceed the number of prompts."""
    groups = [list(g) for g in groups]
    if count > sum(len(g) for g in groups):
        raise ValueError(f"cannot make {count} micro-batches of {sum(len(g) for g in groups)} prompts")
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def prompts_per_micro_batch(budget: int, row_len: int, rows_per_prompt: int) -> int:
    """How many prompts of rows of ``row_len`` tokens a ``budget``-token micro-batch holds (at least one)."""
    return max(budget // (row_len * rows_per_prompt), 1)


def micro_batches(lengths: Sequence[int], rows_per_prompt: int, train: TrainConfig) -> list[list[int]]:
    """This rank's micro-batches of ``train``'s kind; under a token budget every rank makes as many as the rank
    that needs the most (all ranks call this)."""
    if not train.micro_batch_tokens:
        return fixed_count(len(lengths), train.micro_batch_prompts)
    groups = token_budget(lengths, rows_per_prompt, train.micro_batch_tokens)
    count = reduce_metrics({"micro_batches": float(len(groups))}, "max", train.dist_timeout_s)[
        "micro_batches"
    ]
    return split_to(groups, int(count))
