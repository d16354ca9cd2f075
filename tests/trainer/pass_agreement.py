"""What the shared-prefix tests share: the shared pass equals the naive pass in values and parameter gradients.

A plain module beside the tests (like ``loop_helpers``), not a test module, so importing it runs no tests twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlm_grpoma.models.base import SpecialTokens
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.logprobs import PathLogProbs, path_log_probs
from vlm_grpoma.trainer.packed import shared_prefix_log_probs


def weighted_grads(model: torch.nn.Module, logp: PathLogProbs, weights) -> list[torch.Tensor]:
    """The gradient of every trainable parameter of ``weights``-weighted log-probs."""
    model.zero_grad()
    ((logp.thought * weights[0]).sum() + (logp.answer * weights[1]).sum()).backward()
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def assert_shared_equals_naive(
    model: torch.nn.Module, tree: RolloutTree, indices: Sequence[int], tokens: SpecialTokens, seed: int = 1
) -> PathLogProbs:
    """The shared pass's log-probs of ``tree``'s ``indices`` equal the naive pass's (atol 1e-5), and so do the
    gradients of a random weighting of them (every one non-zero); returns the naive log-probs."""
    naive = path_log_probs(model, tree, indices, tokens)
    shared = shared_prefix_log_probs(model, tree, indices, tokens)
    torch.testing.assert_close(shared.thought, naive.thought, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared.answer, naive.answer, atol=1e-5, rtol=0)
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(x.shape, generator=g).to(x.device) for x in (naive.thought, naive.answer)]
    expected, got = weighted_grads(model, naive, weights), weighted_grads(model, shared, weights)
    assert len(got) == len(expected) and expected and all(e.abs().sum() > 0 for e in expected)
    for e, s in zip(expected, got, strict=True):
        torch.testing.assert_close(s, e, atol=1e-5, rtol=1e-4)
    return naive


def assert_recorded_equals_naive(
    model: torch.nn.Module, tree: RolloutTree, tokens: SpecialTokens
) -> PathLogProbs:
    """The log-probs a rollout recorded are the naive pass's for every prompt of ``tree`` (atol 1e-4)."""
    with torch.no_grad():
        naive = path_log_probs(model, tree, list(range(len(tree.prompts))), tokens)
    torch.testing.assert_close(naive.thought, tree.thought_logprobs * tree.thought_mask, atol=1e-4, rtol=0)
    torch.testing.assert_close(naive.answer, tree.answer_logprobs * tree.answer_mask, atol=1e-4, rtol=0)
    return naive
