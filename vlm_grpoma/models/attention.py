"""``model.attn_implementation: flex_attention`` for Qwen-VL: FlexAttention where a BlockMask is given, SDPA else.

transformers (5.2x) refuses ``flex_attention`` for the Qwen-VL classes (no ``_supports_flex_attn``), but they
dispatch attention through ``AttentionInterface`` (``_supports_attention_backend``), so this module registers
its own backend under :data:`BLOCK_MASK_ATTENTION`. It runs torch's ``flex_attention`` when a layer receives
a ``BlockMask`` (the shared-prefix training pass, ``trainer/packed.py``) and SDPA for everything else: the
vision encoder (per-image full attention, no mask) and generation with a 2-D mask and a KV cache, whose masks
are built as SDPA's. On CUDA flex_attention is compiled (fused, block-sparse kernels); on CPU torch has no
FlexAttention backward and its compiled forward takes minutes to build, so the CPU path runs torch's eager
flex_attention (the same mask_mod on the dense grid: correctness, not speed).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

#: The config value that selects this backend.
FLEX_ATTENTION = "flex_attention"
#: Its name in transformers' attention registries (must not contain "flex_attention": transformers then
#: applies its own support check, which the Qwen-VL classes fail).
BLOCK_MASK_ATTENTION = "vlm_grpoma_block_mask"


@cache
def _compiled_flex():
    """torch.compile(flex_attention), built once per process (the fused kernels; CUDA only)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def block_mask_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention backend: flex_attention for a ``BlockMask``, else ``sdpa_attention_forward``."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout > 0 and module.training:
        raise ValueError("flex_attention: attention dropout is not supported (set attention_dropout to 0)")
    kernel = _compiled_flex() if query.device.type == "cuda" else flex_attention
    out = kernel(
        query,
        key,
        value,
        block_mask=attention_mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def hf_attn_implementation(name: str) -> str:
    """The ``attn_implementation`` to hand transformers for a ``model.attn_implementation`` value."""
    if name != FLEX_ATTENTION:
        return name
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(BLOCK_MASK_ATTENTION, block_mask_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(BLOCK_MASK_ATTENTION, sdpa_mask)
    return BLOCK_MASK_ATTENTION
