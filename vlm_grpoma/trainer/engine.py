"""DeepSpeed as the one training engine: the model wrapped with its optimizer and schedule, skip-safe steps.

GPU runs use NCCL and bf16 (ZeRO 0/1/2/3); CPU runs (tests, the demo) use gloo and fp32, or bf16 when asked
(DeepSpeed's CPU accelerator does bf16, not fp16), with the same code. The DeepSpeed JSON comes from
``trainer/deepspeed_config.py``, AdamW and the LR schedule from ``trainer/optim.py``, the model (dtype, LoRA,
frozen vision) from ``models/loading.py``.

Gradient arithmetic. The algorithm's loss (``algorithm/loss.py``) weights every token so that the losses of a
rank's micro-batches *sum* to that rank's batch loss. :meth:`TrainingEngine.backward` therefore calls
``DeepSpeedEngine.backward(loss, scale_wrt_gas=False)``: DeepSpeed's default divides every micro-batch loss by
``gradient_accumulation_steps`` (it assumes micro-batch *means*), which would shrink the gradient by that
factor. DeepSpeed then averages the accumulated gradient over the data-parallel ranks, so the gradient the
optimizer sees is ``mean_ranks( sum_micro grad(loss_micro) )`` — the gradient of the global batch loss when
every rank holds the same number of prompts (``config.validate`` guarantees it). ``tests/trainer`` checks this
against a plain single-process torch computation.

One optimizer step is exactly ``gradient_accumulation_steps`` calls of :meth:`TrainingEngine.backward`
(token-budget runs: the count :meth:`TrainingEngine.plan_step` set, the same on every rank) followed by one
:meth:`TrainingEngine.step`. A non-finite loss or gradient on any rank skips the optimizer
update on all ranks (weights, optimizer moments and LR schedule untouched) and is reported in
:class:`StepResult`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from vlm_grpoma.config import Config
from vlm_grpoma.distributed import DistInfo, import_deepspeed, init_distributed
from vlm_grpoma.models.loading import (
    PRECISION_DTYPE_NAMES,
    TORCH_DTYPES,
    is_peft,
    load_pretrained,
    prepare_trainable,
)
from vlm_grpoma.trainer.collectives import collective
from vlm_grpoma.trainer.deepspeed_config import deepspeed_config, resolve_precision
from vlm_grpoma.trainer.optim import build_optimizer, lr_factor

_GRADIENT_ALL_REDUCE = "the gradient all-reduce of the optimizer step"

# ---------------------------------------------------------------------------------------------------------
# The engine the loop drives


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: the global gradient L2 norm before clipping (non-finite when skipped for it)."""

    grad_norm: float
    skipped: bool
    learning_rate: float


@dataclass
class TrainingEngine:
    """What the loop needs: the DeepSpeed engine, the unwrapped module, and skip-safe backward/step."""

    deepspeed: Any  # deepspeed.DeepSpeedEngine; call it like the module for training forwards
    config: Config
    dist: DistInfo
    precision: str
    gradient_accumulation_steps: int
    reference_module: Any = None  # frozen copy (or its DeepSpeed ZeRO-3 wrapper); None with LoRA or kl_beta=0
    # ZeRO-3: the HfDeepSpeedConfig that transformers sees while it lives: from_pretrained partitions weights
    # and generate() defaults to synced_gpus, so ranks that finish sampling early keep joining the gathers.
    _keepalive: list[Any] = field(default_factory=list, repr=False)
    _micro_steps: int = 0
    _step_micro_batches: int | None = None  # token-budget runs: this step's backward calls (plan_step)

    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped model (a PeftModel with LoRA): generation, saving, parameter access."""
        return self.deepspeed.module

    @property
    def zero_stage(self) -> int:
        return self.deepspeed.zero_optimization_stage()

    @property
    def is_lora(self) -> bool:
        return is_peft(self.module)

    @property
    def has_reference(self) -> bool:
        return self.config.algorithm.kl_beta > 0

    @property
    def learning_rate(self) -> float:
        """The learning rate the next optimizer step will use."""
        return float(self.deepspeed.get_lr()[0])

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken so far, skipped ones included."""
        return int(self.deepspeed.global_steps)

    def plan_step(self, micro_batches: int) -> None:
        """Token-budget runs (``train.micro_batch_tokens``): the next optimizer step takes ``micro_batches``
        backward calls, 1 to ``gradient_accumulation_steps`` and the same on every rank; DeepSpeed's
        accumulation boundary is then set explicitly at the last one."""
        if not 1 <= micro_batches <= self.gradient_accumulation_steps:
            raise ValueError(
                f"{micro_batches} micro-batches: one step takes 1 to {self.gradient_accumulation_steps}"
            )
        self._step_micro_batches = micro_batches

    @property
    def _micro_batches(self) -> int:
        return self._step_micro_batches or self.gradient_accumulation_steps

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate one micro-batch's gradient; ``loss`` is its share of the rank's batch loss.

        A non-finite loss is back-propagated as NaN so that the step's overflow check sees it on every stage.
        """
        count = self._micro_batches
        if self._micro_steps >= count:
            limit = "gradient_accumulation_steps" if self._step_micro_batches is None else "plan_step's count"
            raise RuntimeError(f"backward() called more than {limit}={count} times before step()")
        if not bool(torch.isfinite(loss.detach()).all()):
            loss = loss * float("nan")
        if self._step_micro_batches is not None:
            self.deepspeed.set_gradient_accumulation_boundary(self._micro_steps + 1 == count)
        with collective(_GRADIENT_ALL_REDUCE, self.config.train.dist_timeout_s):
            self.deepspeed.backward(loss, scale_wrt_gas=False)
            self._micro_steps += 1
            if self._micro_steps < count:
                self.deepspeed.step()  # not a boundary: DeepSpeed only advances its micro-step counter

    def step(self) -> StepResult:
        """Apply the accumulated gradient (clipped to ``optim.max_grad_norm``), or skip it if non-finite."""
        if self._micro_steps != self._micro_batches:
            raise RuntimeError(
                f"step() after {self._micro_steps} backward() calls; one optimizer step takes "
                f"exactly {self._micro_batches} micro-batches"
            )
        self._micro_steps, self._step_micro_batches = 0, None
        learning_rate = self.learning_rate
        optimizer = self.deepspeed.optimizer
        # ZeRO-0 fp32: no DeepSpeed wrapper checks overflow
        manual = optimizer is self.deepspeed.basic_optimizer
        if manual:
            grad_norm = _global_norm([p.grad for p in self.module.parameters() if p.grad is not None])
            optimizer.overflow = not math.isfinite(grad_norm)  # DeepSpeed then skips the LR step as well
        with collective(_GRADIENT_ALL_REDUCE, self.config.train.dist_timeout_s):
            self.deepspeed.step()
        if not manual:
            reported = self.deepspeed.get_global_grad_norm()
            grad_norm = float("nan") if reported is None else float(reported)
        return StepResult(
            grad_norm=grad_norm, skipped=not self.deepspeed.was_step_applied(), learning_rate=learning_rate
        )

    def close(self) -> None:
        """Stop ZeRO-3 mode for later ``from_pretrained``/``generate`` calls in this process."""
        self._keepalive.clear()

    @contextmanager
    def generation(self) -> Iterator[torch.nn.Module]:
        """The unwrapped module in eval mode without grad, ZeRO-3 parameters gathered (all ranks enter)."""
        module = self.module
        gather = nullcontext()
        if self.zero_stage == 3:
            gather = import_deepspeed().zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
        was_training = module.training
        with gather, torch.no_grad():
            module.eval()
            try:
                yield module
            finally:
                module.train(was_training)

    @contextmanager
    def reference(self) -> Iterator[Callable[..., Any]]:
        """A callable reference model for KL log-probs, without grad: the frozen copy or the LoRA base."""
        if not self.has_reference:
            raise RuntimeError("no reference model: algorithm.kl_beta is 0")
        with torch.no_grad():
            if self.is_lora:
                with self.module.disable_adapter():
                    yield self.deepspeed
            else:
                yield self.reference_module


def _global_norm(tensors: list[torch.Tensor]) -> float:
    """L2 norm over all ``tensors`` together, accumulated in float64."""
    if not tensors:
        return 0.0
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.double()) for t in tensors]))
    )


def build_engine(config: Config, model: torch.nn.Module | None = None) -> TrainingEngine:
    """Initialise the process group, load (or take) the model, and wrap it in DeepSpeed with AdamW + schedule.

    ``model``: an already-built ``transformers`` model to train instead of loading ``model.name_or_path``
    (tests, SFT warm starts held in memory). The LR schedule spans ``train.steps * algorithm.policy_epochs``
    optimizer steps.
    """
    deepspeed = import_deepspeed()
    dist = init_distributed(config.deepspeed.dist_backend, config.train.dist_timeout_s)
    on_gpu = dist.device.type == "cuda"
    ds_config = deepspeed_config(config, dist.world_size, on_gpu=on_gpu)
    precision = resolve_precision(config, on_gpu)
    dtype = TORCH_DTYPES[PRECISION_DTYPE_NAMES[precision]]
    stage = config.deepspeed.zero_stage
    keepalive: list[Any] = []
    if stage == 3:
        from transformers.integrations import HfDeepSpeedConfig

        keepalive.append(HfDeepSpeedConfig(ds_config))  # from_pretrained now partitions weights as it loads
    base = model if model is not None else load_pretrained(config.model, dtype)
    use_kl = config.algorithm.kl_beta > 0
    reference = None
    if use_kl and not config.model.lora.enabled:
        reference = (
            copy.deepcopy(base) if model is not None or stage != 3 else load_pretrained(config.model, dtype)
        )
        reference.requires_grad_(False).eval()
    module = prepare_trainable(base, config.model)
    module.train()

    optim = config.optim
    total = config.train.steps * config.algorithm.policy_epochs
    optimizer = build_optimizer(module, optim, offload=config.deepspeed.offload_optimizer)

    def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: lr_factor(
                s, schedule=optim.lr_scheduler, warmup_steps=optim.warmup_steps, total_steps=total
            ),
        )

    engine, *_ = deepspeed.initialize(
        model=module, optimizer=optimizer, lr_scheduler=schedule, config=ds_config, dist_init_required=False
    )
    if reference is not None:
        reference = _wrap_reference(deepspeed, reference, ds_config, dist, dtype)
    return TrainingEngine(
        deepspeed=engine,
        config=config,
        dist=dist,
        precision=precision,
        gradient_accumulation_steps=ds_config["gradient_accumulation_steps"],
        reference_module=reference,
        _keepalive=keepalive,
    )


def _wrap_reference(
    deepspeed, reference: torch.nn.Module, ds_config: dict[str, Any], dist: DistInfo, dtype: torch.dtype
) -> torch.nn.Module:
    """ZeRO-3: an optimizer-less DeepSpeed engine keeping the frozen copy partitioned; else it on device."""
    if ds_config["zero_optimization"]["stage"] != 3:
        return reference.to(device=dist.device, dtype=dtype)
    ref_config = {
        key: ds_config[key] for key in ("bf16", "fp16", "zero_optimization", "zero_allow_untested_optimizer")
    }
    ref_config["zero_optimization"] = {
        k: v for k, v in ref_config["zero_optimization"].items() if k != "offload_optimizer"
    }
    ref_config.update(
        train_micro_batch_size_per_gpu=ds_config["train_micro_batch_size_per_gpu"],
        train_batch_size=ds_config["train_micro_batch_size_per_gpu"] * dist.world_size,
        gradient_accumulation_steps=1,
        steps_per_print=10**9,
    )
    engine, *_ = deepspeed.initialize(model=reference, config=ref_config, dist_init_required=False)
    engine.eval()
    return engine
