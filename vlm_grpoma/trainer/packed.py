"""Shared-prefix training pass: each prompt's image (if any) + text once, each thought once for its M answers.

Same contract and numbers as :func:`~vlm_grpoma.trainer.logprobs.path_log_probs` (the naive pass, one row
per (prompt, thought, answer) path), with gradients, through the model's own attention.

Layout: one packed row per prompt, ``[left pad][prompt][thought_1][answer_11]..[answer_1M][thought_2]..``.
A 4-D attention mask lets a thought see its prompt and itself, and an answer its prompt, its own thought and
itself (causally); mRoPE positions come from the model's ``get_rope_index`` for the prompt and continue as
``last + 1`` on all three axes as if each answer directly followed its thought — what the rollout and the
naive pass see. Each kept column's log-sum-exp is computed once, and a column may predict several targets
(the last prompt token predicts every thought's first token, a thought's last token every answer's first).

Why a packed row rather than a prompt KV cache expanded with grad (exact too, but wrong under gradient
checkpointing and heavier in memory): ``docs/architecture.md``, Decisions. The row's segment table (which
thought and answer each column belongs to) gives the mask in two forms from one visibility rule: a dense 4-D
``[L, L]`` additive mask for SDPA and eager attention (L^2 memory per row), or a FlexAttention ``BlockMask``
(``model.attn_implementation: flex_attention``, ``models/attention.py``) built stripe by stripe in
O(L * 128) memory and holding only O((L / 128)^2) block indices. FlashAttention takes neither and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.models.attention import BLOCK_MASK_ATTENTION, FLEX_ATTENTION
from vlm_grpoma.models.base import (
    VISION_KEYS,
    SpecialTokens,
    collate,
    rope_index_owner,
    rope_positions,
    vision_inputs,
)
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logprobs import RAW_SCORING, PathLogProbs, ScoringOptions, tempered, token_entropy

#: Attention implementations that accept an arbitrary 4-D additive mask.
MASKABLE_ATTENTION = ("sdpa", "eager")
#: FlexAttention's block size (query and key): the granularity of the BlockMask's sparsity.
FLEX_BLOCK = 128


@dataclass
class PackedBatch:
    """Packed rows for b prompts: model inputs plus, per target token, the column whose logits predict it."""

    input_ids: torch.Tensor  # [b, L]
    position_ids: torch.Tensor  # [3, b, L]
    valid: torch.Tensor  # [b, L] bool: a real token (not padding)
    thought_of: torch.Tensor  # [b, L] thought index k of a thought or answer column, -1 in the prompt
    answer_of: torch.Tensor  # [b, L] answer index m of an answer column, -1 elsewhere
    mm_token_type_ids: torch.Tensor  # [b, L]
    vision: dict[str, torch.Tensor]  # the prompts' images and videos (models/base.VISION_KEYS); {}: text-only
    first_target_column: int  # columns before this one never predict a target (the left-padded prompt)
    # [b, K, Lt] predicting column of each thought token (any valid one at padding)
    thought_source: torch.Tensor
    answer_source: torch.Tensor  # [b, K, M, La]


def pack(
    model: torch.nn.Module, tree: RolloutTree, prompt_indices: Sequence[int], tokens: SpecialTokens
) -> PackedBatch:
    """Build the packed rows of ``prompt_indices`` (token bookkeeping on the CPU; no model forward)."""
    _, k_count, m_count = tree.shape
    lt, la = tree.thought_ids.shape[-1], tree.answer_ids.shape[-1]
    prompts = [tree.prompts[b] for b in prompt_indices]
    head = collate(prompts, [p.input_ids.tolist() for p in prompts], range(len(prompts)), tokens)
    prompt_pos = rope_positions(rope_index_owner(model), head)
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

    mm_types = torch.zeros((n, total), dtype=torch.long)
    mm_types[:, :width] = head["mm_token_type_ids"]
    return PackedBatch(
        input_ids,
        position_ids,
        valid,
        thought_of,
        answer_of,
        mm_types,
        {key: head[key] for key in VISION_KEYS if key in head},
        width - 1,
        torch.stack(thought_source),
        torch.stack(answer_source),
    )


def _visible(
    valid: torch.Tensor,
    thought_of: torch.Tensor,
    answer_of: torch.Tensor,
    b: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
) -> torch.Tensor:
    """May query ``q`` of row ``b`` attend key ``kv``: causal, real, and in the prompt, in q's own thought or
    q's own answer; padding queries see themselves (no empty softmax rows). Broadcasts, and is FlexAttention's
    mask_mod as it stands."""
    t_q, t_kv, a_q, a_kv = thought_of[b, q], thought_of[b, kv], answer_of[b, q], answer_of[b, kv]
    branch = (t_kv == -1) | ((t_kv == t_q) & ((a_kv == -1) | (a_kv == a_q)))
    return ((q >= kv) & valid[b, kv] & branch) | (q == kv)


def allowed(packed: PackedBatch, queries: slice = slice(None)) -> torch.Tensor:
    """``[b, q, L]`` bool: which keys each query (of the ``queries`` columns) may attend — the dense mask."""
    n, total = packed.input_ids.shape
    q = torch.arange(total)[queries]
    return _visible(
        packed.valid,
        packed.thought_of,
        packed.answer_of,
        torch.arange(n)[:, None, None],
        q[None, :, None],
        torch.arange(total)[None, None, :],
    )


def dense_mask(packed: PackedBatch, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive ``[b, 1, L, L]`` mask SDPA and eager attention take (0 where visible, dtype min else)."""
    hidden = ~allowed(packed).to(device)
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, torch.finfo(dtype).min)[
        :, None
    ]


def block_mask(packed: PackedBatch, device: torch.device, block: int = FLEX_BLOCK):
    """The FlexAttention ``BlockMask`` of the packed rows, built one stripe of ``block`` queries at a time.

    Each (query block, key block) pair is empty, full (every pair visible: no mask_mod call) or partial (the
    mask_mod decides per element); the segment tables are padded to whole blocks so the mask_mod never
    indexes past a row.
    """
    from torch.nn.attention.flex_attention import BlockMask

    n, total = packed.input_ids.shape
    blocks = -(-total // block)
    pad = blocks * block - total
    valid = torch.nn.functional.pad(packed.valid, (0, pad), value=False)
    thought_of = torch.nn.functional.pad(packed.thought_of, (0, pad), value=-1)
    answer_of = torch.nn.functional.pad(packed.answer_of, (0, pad), value=-1)
    in_range = torch.arange(blocks * block) < total
    partial = torch.zeros((n, blocks, blocks), dtype=torch.bool)
    full = torch.zeros((n, blocks, blocks), dtype=torch.bool)
    keys = torch.arange(blocks * block)[None, None, :]
    for i in range(blocks):
        q = torch.arange(i * block, (i + 1) * block)[None, :, None]
        stripe = _visible(valid, thought_of, answer_of, torch.arange(n)[:, None, None], q, keys)
        stripe &= in_range[q] & in_range[keys]  # [n, block, blocks * block]
        stripe = stripe.view(n, block, blocks, block)
        some, every = stripe.any(dim=(1, 3)), stripe.all(dim=(1, 3))
        partial[:, i], full[:, i] = some & ~every, every

    def indices(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(count [n, 1, blocks], key-block indices [n, 1, blocks, blocks] with the chosen ones first)."""
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)
        return chosen.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    def mask_mod(b, h, q_idx, kv_idx):
        return _visible(valid_d, thought_d, answer_d, b, q_idx, kv_idx)

    valid_d, thought_d, answer_d = valid.to(device), thought_of.to(device), answer_of.to(device)
    (count, index), (full_count, full_index) = indices(partial), indices(full)
    return BlockMask.from_kv_blocks(
        count.to(device),
        index.to(device),
        full_count.to(device),
        full_index.to(device),
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(total, total),
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
    if attn not in (*MASKABLE_ATTENTION, BLOCK_MASK_ATTENTION):
        raise ValueError(
            f"shared-prefix log-probs need a 4-D attention mask or a FlexAttention block mask; "
            f"attn_implementation {attn!r} takes neither (use one of {', '.join(MASKABLE_ATTENTION)}, "
            f"{FLEX_ATTENTION}, or the naive pass)"
        )
    parameter = next(model.parameters())
    dev, dtype = parameter.device, parameter.dtype
    packed = pack(model, tree, prompt_indices, tokens)
    if attn == BLOCK_MASK_ATTENTION:
        if dev.type == "cpu" and torch.is_grad_enabled():
            raise ValueError(
                f"model.attn_implementation: {FLEX_ATTENTION} has no backward on CPU in torch "
                f"{torch.__version__} (forward only, e.g. reference log-probs); train on CPU with sdpa"
            )
        mask = block_mask(packed, dev)
    else:
        mask = dense_mask(packed, dtype, dev)
    keep = packed.input_ids.shape[1] - packed.first_target_column
    # text-only rows: no vision inputs at all; a mixed batch carries the pictured prompts' only
    visual = vision_inputs(packed.vision, dev, dtype)
    logits = model(
        input_ids=packed.input_ids.to(dev),
        attention_mask=mask,
        position_ids=packed.position_ids.to(dev),
        mm_token_type_ids=packed.mm_token_type_ids.to(dev),
        use_cache=False,
        logits_to_keep=keep,
        **visual,
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
