"""The rollout backend protocol: sampling parameters in, a :class:`RolloutTree` out; trained weights in.

Phase 1 samples K thoughts per prompt, each ending at ``</think>`` or closed by force at the thought budget;
phase 2 samples M answers continuing each thought, ending at ``</answer>``, end of turn, or the answer budget.
``sample_answers`` samples more answers after the thoughts of a tree, a count per thought (adaptive answers:
the trainer scores the first answers and allocates the rest between the two calls).
Each backend owns how it follows the trained policy (``update_weights``, called after every optimizer step).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import torch

from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams


class GeneratingModel(Protocol):
    """A training engine as a rollout backend sees it (``trainer.engine.TrainingEngine``, which would import
    upwards): its unwrapped module, and that module made ready to sample from (eval mode, no grad, ZeRO-3
    parameters gathered; a collective on all ranks)."""

    @property
    def module(self) -> torch.nn.Module: ...

    def generation(self) -> AbstractContextManager[torch.nn.Module]: ...


#: the policy a backend samples or copies weights from: a plain module, or a training engine
Policy: TypeAlias = "torch.nn.Module | GeneratingModel"


class RolloutEngine(Protocol):
    """A backend that samples the K x M tree for a batch of prompts with the policy's current weights."""

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree: ...

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        """``counts[b, k]`` (``[B, K]`` int, 0: none) more answers continuing thought (b, k) of ``tree``: a
        ragged tree of the same thoughts, ``counts.max()`` answer slots each (``answer_present``)."""
        ...

    def update_weights(self, model: Policy) -> int:
        """Bring the backend in step with ``model`` (a module, or a training engine: see :func:`full_module`).

        Called on every rank after each optimizer step. Returns how many weight tensors were copied (0 for a
        backend that samples from the live module).
        """
        ...


@contextmanager
def full_module(model: Policy) -> Iterator[torch.nn.Module]:
    """The complete policy module behind ``model``: a plain module itself, or a training engine's module inside
    its ``generation()`` context (eval mode, no grad, ZeRO-3 parameters gathered; a collective on all ranks)."""
    import torch

    if isinstance(model, torch.nn.Module):
        yield model
    else:
        with model.generation() as module:
            yield module
