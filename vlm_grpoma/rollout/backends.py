"""Choosing the rollout backend from the config.

``build_rollout_engine`` returns a :class:`~vlm_grpoma.rollout.base.RolloutEngine` for ``rollout.backend``:
``hf`` samples from the live training module (ZeRO-3 parameters gathered around each rollout), ``vllm`` builds
a colocated vLLM engine (a CUDA or a CPU build of vLLM; imported lazily, so this module loads everywhere),
``vllm_server`` samples from rollout servers on other devices or nodes (:mod:`vlm_grpoma.rollout.server`).
Each backend follows the trained policy through its own ``update_weights``, which the trainer calls after
every optimizer step (a no-op for ``hf``, a weight push for ``vllm_server``). How far a backend's recorded log-probs drift from the trainer's is
measured by :func:`vlm_grpoma.algorithm.diagnostics.logprob_mismatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from vlm_grpoma.config import Config
from vlm_grpoma.distributed import DistInfo
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.base import GeneratingModel, Policy, RolloutEngine, full_module
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.vllm.options import VLLMOptions


@dataclass
class GatheredHFRollout:
    """The transformers backend on a DeepSpeed :class:`~vlm_grpoma.trainer.engine.TrainingEngine`: each rollout
    runs inside ``training.generation()`` (eval mode, no grad, ZeRO-3 parameters gathered on all ranks)."""

    training: GeneratingModel
    adapter: QwenVLAdapter

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        with full_module(self.training) as module:
            return HFRolloutEngine.for_adapter(module, self.adapter).sample(prompts, params)

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        with full_module(self.training) as module:
            return HFRolloutEngine.for_adapter(module, self.adapter).sample_answers(tree, counts, params)

    def update_weights(self, model: Policy) -> int:
        """Nothing to copy: every rollout gathers the live training module."""
        return 0


def build_rollout_engine(
    config: Config,
    model: Policy,
    adapter: QwenVLAdapter,
    *,
    dist: DistInfo | None = None,
    vllm_options_override: VLLMOptions | None = None,
) -> RolloutEngine:
    """The backend named by ``config.rollout.backend`` for ``model`` (a TrainingEngine or a plain module).

    ``vllm``: needs an importable vLLM with a usable device (one actionable error line otherwise); the engine
    is built from ``config.model.name_or_path`` in the training dtype and then loaded with ``model``'s current
    weights, so a resumed or SFT-initialised policy samples with its own weights. ``vllm_options_override``:
    other engine options than :func:`vllm_options` (tests and benchmarks). ``vllm_server``: the rollout servers
    of ``rollout.server`` (checked, then sent ``model``'s current weights the same way).
    """
    backend = config.rollout.backend
    if backend == "hf":
        if isinstance(model, torch.nn.Module):
            return HFRolloutEngine.for_adapter(model, adapter)
        return GatheredHFRollout(model, adapter)
    if backend == "vllm":
        from vlm_grpoma.rollout.vllm import VLLMRolloutEngine

        module = model if isinstance(model, torch.nn.Module) else model.module
        options = vllm_options_override or vllm_options(
            config, str(next(module.parameters()).dtype).removeprefix("torch.")
        )
        engine = VLLMRolloutEngine.create(
            config.model.name_or_path,
            adapter,
            options,
            seed=config.seed,
            dist=dist if dist is not None else getattr(model, "dist", None),
            trust_remote_code=config.model.trust_remote_code,
        )
    elif backend == "vllm_server":
        from vlm_grpoma.rollout.server.client import ServerRolloutEngine

        engine = ServerRolloutEngine.create(
            config, adapter, dist=dist if dist is not None else getattr(model, "dist", None)
        )
    else:
        raise ValueError(f"rollout.backend: unknown backend {backend!r}; expected hf, vllm or vllm_server")
    engine.update_weights(model)
    return engine


def vllm_options(config: Config, dtype: str) -> VLLMOptions:
    """The vLLM engine options of ``config`` (``rollout.vllm``) for a policy trained in ``dtype``: the colocated
    engine's and a rollout server's alike."""
    from vlm_grpoma.rollout.vllm import VLLMOptions

    # at T = 1 (or greedy) raw log-probs are the tempered ones, and exact: processed ones would leave the
    # banned vision/end tokens out of the softmax, which the trainer's forward keeps
    temperature = config.rollout.temperature
    tempered = config.algorithm.logprob_temperature == "sampling" and temperature not in (0.0, 1.0)
    options = VLLMOptions.from_config(config.rollout.vllm, tempered_logprobs=tempered)
    # vLLM's "auto" turns a float32 config into float16: use the training dtype
    return replace(options, dtype=dtype) if options.dtype == "auto" else options
