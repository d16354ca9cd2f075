"""Choosing the rollout backend from the config.

``build_rollout_engine`` returns a :class:`~vlm_grpoma.rollout.base.RolloutEngine` for ``rollout.backend``:
``hf`` samples from the live training module (ZeRO-3 parameters gathered around each rollout), ``vllm`` builds
a colocated vLLM engine (a CUDA or a CPU build of vLLM; imported lazily, so this module loads everywhere).
Each backend follows the trained policy through its own ``update_weights``, which the trainer calls after
every optimizer step (a no-op for ``hf``). How far a backend's recorded log-probs drift from the trainer's is
measured by :func:`vlm_grpoma.algorithm.diagnostics.logprob_mismatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.config import Config
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.base import RolloutEngine, full_module
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter


@dataclass
class GatheredHFRollout:
    """The transformers backend on a DeepSpeed :class:`~vlm_grpoma.trainer.engine.TrainingEngine`: each rollout
    runs inside ``training.generation()`` (eval mode, no grad, ZeRO-3 parameters gathered on all ranks)."""

    training: Any
    adapter: QwenVLAdapter

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        with full_module(self.training) as module:
            return HFRolloutEngine.for_adapter(module, self.adapter).sample(prompts, params)

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        with full_module(self.training) as module:
            return HFRolloutEngine.for_adapter(module, self.adapter).sample_answers(tree, counts, params)

    def update_weights(self, model: Any) -> int:
        """Nothing to copy: every rollout gathers the live training module."""
        return 0


def build_rollout_engine(
    config: Config, model: Any, adapter: QwenVLAdapter, *, dist: Any = None, vllm_options: Any = None
) -> RolloutEngine:
    """The backend named by ``config.rollout.backend`` for ``model`` (a TrainingEngine or a plain module).

    ``vllm``: needs an importable vLLM with a usable device (one actionable error line otherwise); the engine
    is built from ``config.model.name_or_path`` in the training dtype and then loaded with ``model``'s current
    weights, so a resumed or SFT-initialised policy samples with its own weights. ``vllm_options``: a
    :class:`~vlm_grpoma.rollout.vllm.options.VLLMOptions` (default: from ``rollout.vllm``; ``dtype="auto"``
    means the training module's dtype).
    """
    backend = config.rollout.backend
    if backend == "hf":
        if isinstance(model, torch.nn.Module):
            return HFRolloutEngine.for_adapter(model, adapter)
        return GatheredHFRollout(model, adapter)
    if backend == "vllm":
        from vlm_grpoma.rollout.vllm import VLLMOptions, VLLMRolloutEngine

        # at T = 1 (or greedy) raw log-probs are the tempered ones, and exact: processed ones would leave the
        # banned vision/end tokens out of the softmax, which the trainer's forward keeps
        temperature = config.rollout.temperature
        tempered = config.algorithm.logprob_temperature == "sampling" and temperature not in (0.0, 1.0)
        options = vllm_options or VLLMOptions.from_config(config.rollout.vllm, tempered_logprobs=tempered)
        # vLLM's "auto" turns a float32 config into float16: use the training dtype
        if options.dtype == "auto":
            module = model if isinstance(model, torch.nn.Module) else model.module
            options = replace(options, dtype=str(next(module.parameters()).dtype).removeprefix("torch."))
        engine = VLLMRolloutEngine.create(
            config.model.name_or_path,
            adapter,
            options,
            seed=config.seed,
            dist=dist if dist is not None else getattr(model, "dist", None),
            trust_remote_code=config.model.trust_remote_code,
        )
        engine.update_weights(model)
        return engine
    raise ValueError(f"rollout.backend: unknown backend {backend!r}; expected hf or vllm")
