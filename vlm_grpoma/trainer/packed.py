"""Shared-prefix training pass: each prompt's image + text once, each thought once for its M answers.

Same contract and numbers as :func:`~vlm_grpoma.trainer.logprobs.path_log_probs` (the naive pass, one row
per (prompt, thought, answer) path), with gradients, through the model's own attention.

Layout: one packed row per prompt, ``[left pad][prompt][thought_1][answer_11]..[answer_1M][thought_2]..``.
A 4-D attention mask lets a thought see its prompt and itself, and an answer its prompt, its own thought and
itself (causally); mRoPE positions come from the model's ``get_rope_index`` for the prompt and continue as
``last + 1`` on all three axes as if each answer directly followed its thought — what the rollout and the
naive pass see. Each kept column's log-sum-exp is computed once, and a column may predict several targets
(the last prompt token predicts every thought's first token, a thought's last token every answer's first).

Why a packed row rather than a prompt KV cache expanded with grad (exact too, but wrong under gradient
checkpointing and heavier in memory): ``docs/architecture.md``, Decisions. Eager and SDPA take the 4-D mask;
FlashAttention does not, and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.models.base import SpecialTokens, collate, rope_index_owner
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logprobs import RAW_SCORING, PathLogProbs, ScoringOptions, tempered, token_entropy

#: Attention implementations that accept an arbitrary 4-D additive mask.
MASKABLE_ATTENTION = ("sdpa", "eager")


@dataclass
class PackedBatch:
    """Packed rows for b prompts: model inputs plus, per target token, the column whose logits predict it."""

    input_ids: torch.Tensor  # [b, L]
    position_ids: torch.Tensor  # [3, b, L]
    allowed: torch.Tensor  # [b, L, L] bool: query i may attend key j
    mm_token_type_ids: torch.Tensor  # [b, L]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    first_target_column: int  # columns before this one never predict a target (the left-padded prompt)
    thought_source: (
        torch.Tensor
    )  # [b, K, Lt] predicting column of each thought token (any valid one at padding)
    answer_source: torch.Tensor  # [b, K, M, La]


def pack(
    model: torch.nn.Module, tree: RolloutTree, prompt_indices: Sequence[int], tokens: SpecialTokens
) -> PackedBatch:
    """Build the packed rows of ``prompt_indices`` (token bookkeeping on the CPU; no model forward)."""
    _, k_count, m_count = tree.shape
    lt, la = tree.thought_ids.shape[-1], tree.answer_ids.shape[-1]
    prompts = [tree.prompts[b] for b in prompt_indices]
    head = collate(prompts, [p.input_ids.tolist() for p in prompts], range(len(prompts)), tokens)
    prompt_pos, _ = rope_index_owner(model).get_rope_index(
        input_ids=head["input_ids"],
        mm_token_type_ids=head["mm_token_type_ids"],
        image_grid_thw=head["image_grid_thw"],
        attention_mask=head["attention_mask"],
    )
    next_pos = prompt_pos.amax(dim=(0, 2)) + 1  # [b]
    width = head["input_ids"].shape[1]

    branches, thought_source, answer_source = [], [], []
    for row, b in enumerate(prompt_indices):
        ids, pos, thought_of, answer_of = [], [], [], []
        t_src = torch.full((k_count, lt), width - 1, dtype=torch.long)
        a_src = torch.full((k_count, m_count, la), width - 1, dtype=torch.long)
        for k in range(k_count):
            thought = tree.thought_tokens(b, k).tolist()
            start = width + len(ids)
            t_src[k, : len(thought)] = torch.arange(start - 1, start - 1 + len(thought))
            t_src[k, 0] = width - 1  # every thought's first token is predicted by the prompt's last token
            ids += thought
            pos += range(len(thought))
            thought_of += [k] * len(thought)
            answer_of += [-1] * len(thought)
            for m in range(m_count):
                answer = tree.answer_tokens(b, k, m).tolist()
                start_a = width + len(ids)
                # each answer token is predicted by its predecessor, the first one by the thought's last token
                a_src[k, m, : len(answer)] = torch.arange(start_a - 1, start_a - 1 + len(answer))
                a_src[k, m, 0] = start - 1 + len(thought)
                ids += answer
                pos += range(len(thought), len(thought) + len(answer))
                thought_of += [k] * len(answer)
                answer_of += [m] * len(answer)
        branches.append((ids, [p + int(next_pos[row]) for p in pos], thought_of, answer_of))
        thought_source.append(t_src)
        answer_source.append(a_src)

    total = width + max(len(br[0]) for br in branches)
    n = len(prompts)
    input_ids = torch.full((n, total), tokens.pad_id, dtype=torch.long)
    position_ids = torch.zeros((3, n, total), dtype=torch.long)
    valid = torch.zeros((n, total), dtype=torch.bool)
    thought_of = torch.full((n, total), -1, dtype=torch.long)
    answer_of = torch.full((n, total), -1, dtype=torch.long)
    input_ids[:, :width], position_ids[:, :, :width] = head["input_ids"], prompt_pos
    valid[:, :width] = head["attention_mask"].bool()
    for row, (ids, pos, t_of, a_of) in enumerate(branches):
        end = width + len(ids)
        input_ids[row, width:end] = torch.tensor(ids, dtype=torch.long)
        position_ids[:, row, width:end] = torch.tensor(pos, dtype=torch.long)
        valid[row, width:end] = True
        thought_of[row, width:end] = torch.tensor(t_of, dtype=torch.long)
        answer_of[row, width:end] = torch.tensor(a_of, dtype=torch.long)

    # key j visible to query i: causal, real, and in the prompt or in i's own thought or i's own answer
    same_branch = (thought_of[:, None, :] == thought_of[:, :, None]) & (
        (answer_of[:, None, :] == -1) | (answer_of[:, None, :] == answer_of[:, :, None])
    )
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    allowed = causal & valid[:, None, :] & ((thought_of[:, None, :] == -1) | same_branch)
    allowed |= torch.eye(total, dtype=torch.bool)  # padding queries see themselves (no empty softmax rows)
    mm_types = torch.zeros((n, total), dtype=torch.long)
    mm_types[:, :width] = head["mm_token_type_ids"]
    return PackedBatch(
        input_ids,
        position_ids,
        allowed,
        mm_types,
        head["pixel_values"],
        head["image_grid_thw"],
        width - 1,
        torch.stack(thought_source),
        torch.stack(answer_source),
    )


def shared_prefix_log_probs(
    model: torch.nn.Module,
    tree: RolloutTree,
    prompt_indices: Sequence[int],
    tokens: SpecialTokens,
    options: ScoringOptions = RAW_SCORING,
) -> PathLogProbs:
    """Log-probs (with grad if enabled) of the thoughts and answers of ``prompt_indices``, one packed forward."""
    module = getattr(model, "module", model)  # a DeepSpeed engine's .config is its own JSON, not the model's
    attn = getattr(module.config, "_attn_implementation", "sdpa")
    if attn not in MASKABLE_ATTENTION:
        raise ValueError(
            f"shared-prefix log-probs need a 4-D attention mask; attn_implementation {attn!r} does "
            f"not take one (use one of {', '.join(MASKABLE_ATTENTION)}, or the naive pass)"
        )
    parameter = next(model.parameters())
    dev, dtype = parameter.device, parameter.dtype
    packed = pack(model, tree, prompt_indices, tokens)
    mask = torch.zeros(packed.allowed.shape, dtype=dtype, device=dev).masked_fill_(
        ~packed.allowed.to(dev), torch.finfo(dtype).min
    )[:, None]
    keep = packed.input_ids.shape[1] - packed.first_target_column
    logits = model(
        input_ids=packed.input_ids.to(dev),
        attention_mask=mask,
        position_ids=packed.position_ids.to(dev),
        pixel_values=packed.pixel_values.to(dev, dtype),
        image_grid_thw=packed.image_grid_thw.to(dev),
        mm_token_type_ids=packed.mm_token_type_ids.to(dev),
        use_cache=False,
        logits_to_keep=keep,
    ).logits
    logits = tempered(logits, options.temperature)
    lse = torch.logsumexp(logits, dim=-1)  # [b, keep]: once per column, shared by all the targets it predicts
    entropy = token_entropy(logits, differentiable=options.entropy_grad) if options.entropy else None

    def at(source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of each target's predicting column in the kept logits."""
        rows = (
            torch.arange(source.shape[0], device=dev).view(-1, *([1] * (source.dim() - 1))).expand_as(source)
        )
        return rows, source.to(dev) - packed.first_target_column

    index = list(prompt_indices)
    thought_mask, answer_mask = tree.thought_mask[index].to(dev), tree.answer_mask[index].to(dev)
    t_rows, t_cols = at(packed.thought_source)
    a_rows, a_cols = at(packed.answer_source)
    thought = logits[t_rows, t_cols, tree.thought_ids[index].to(dev)] - lse[t_rows, t_cols]
    answer = logits[a_rows, a_cols, tree.answer_ids[index].to(dev)] - lse[a_rows, a_cols]
    scores = PathLogProbs(thought * thought_mask, answer * answer_mask)
    if entropy is not None:
        scores.thought_entropy = entropy[t_rows, t_cols] * thought_mask
        scores.answer_entropy = entropy[a_rows, a_cols] * answer_mask
    return scores
