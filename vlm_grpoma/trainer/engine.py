"""DeepSpeed as the one training engine: process group, model loading, ZeRO config, optimizer, safe steps.

GPU runs use NCCL and bf16 (ZeRO 0/1/2/3); CPU runs (tests, the demo) use gloo and fp32 with the same code.

Gradient arithmetic. The algorithm's loss (``algorithm/loss.py``) weights every token so that the losses of a
rank's micro-batches *sum* to that rank's batch loss. :meth:`TrainingEngine.backward` therefore calls
``DeepSpeedEngine.backward(loss, scale_wrt_gas=False)``: DeepSpeed's default divides every micro-batch loss by
``gradient_accumulation_steps`` (it assumes micro-batch *means*), which would shrink the gradient by that
factor. DeepSpeed then averages the accumulated gradient over the data-parallel ranks, so the gradient the
optimizer sees is ``mean_ranks( sum_micro grad(loss_micro) )`` — the gradient of the global batch loss when
every rank holds the same number of prompts (``config.validate`` guarantees it). ``tests/trainer`` checks this
against a plain single-process torch computation.

One optimizer step is exactly ``gradient_accumulation_steps`` calls of :meth:`TrainingEngine.backward`
followed by one :meth:`TrainingEngine.step`. A non-finite loss or gradient on any rank skips the optimizer
update on all ranks (weights, optimizer moments and LR schedule untouched) and is reported in
:class:`StepResult`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vlm_grpoma.config import Config, ConfigError, ModelConfig, OptimConfig, gradient_accumulation_steps
from vlm_grpoma.distributed import DistInfo, import_deepspeed, init_distributed

#: ``configs/deepspeed`` of the source tree (the JSON files ship with the repository).
DEEPSPEED_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"
#: Module names that hold a VLM's vision encoder (Qwen-VL: ``model.visual``).
VISION_MODULE_NAMES = ("visual", "vision_tower", "vision_model")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------------------------------
# DeepSpeed config and learning-rate schedule


def resolve_precision(config: Config, on_gpu: bool) -> str:
    """``fp32`` / ``bf16`` / ``fp16`` from ``deepspeed.precision`` and ``model.dtype`` (which must agree)."""
    precision, dtype = config.deepspeed.precision, config.model.dtype
    if precision == "auto":
        if dtype != "auto":
            precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
        else:
            precision = "bf16" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    elif dtype != "auto" and _TORCH_DTYPES[dtype] != _PRECISION_DTYPES[precision]:
        raise ConfigError(
            f"model.dtype: {dtype} contradicts deepspeed.precision={precision}; set one of them to auto"
        )
    if precision != "fp32" and not on_gpu:
        raise ConfigError(
            f"deepspeed.precision: {precision} needs a GPU; CPU runs train in fp32 (use auto or fp32)"
        )
    return precision


def _base_deepspeed_json(config: Config) -> dict[str, Any]:
    """The JSON named by ``deepspeed.config_file``, else ``configs/deepspeed/zero{stage}.json``."""
    stage = config.deepspeed.zero_stage
    if config.deepspeed.config_file:
        path = Path(config.deepspeed.config_file)
        key = "deepspeed.config_file"
    else:  # ZeRO-1 shares ZeRO-2's bucket settings; the stage is set below
        path = DEEPSPEED_CONFIG_DIR / f"zero{2 if stage == 1 else stage}.json"
        key = "deepspeed.zero_stage"
    if not path.is_file():
        raise ConfigError(f"{key}: DeepSpeed config {path} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{key}: {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} must hold a JSON object")
    return data


def deepspeed_config(config: Config, world_size: int, *, on_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config: the stage's JSON file with batch, precision and clipping from the run config.

    The run config wins over the JSON for ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps``, ``gradient_clipping``, ``bf16``/``fp16`` and the ZeRO stage.
    """
    precision = resolve_precision(config, on_gpu)
    ds = _base_deepspeed_json(config)
    zero = dict(ds.get("zero_optimization", {}))
    zero["stage"] = config.deepspeed.zero_stage
    if config.deepspeed.offload_optimizer:
        if config.deepspeed.zero_stage == 0:
            raise ConfigError("deepspeed.offload_optimizer: needs deepspeed.zero_stage >= 1")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    ds.update(
        train_batch_size=config.train.prompts_per_step,
        train_micro_batch_size_per_gpu=config.train.micro_batch_prompts,
        gradient_accumulation_steps=gradient_accumulation_steps(config, world_size),
        gradient_clipping=config.optim.max_grad_norm,
        zero_optimization=zero,
        bf16={"enabled": precision == "bf16", "check_grad_overflow": True},
        fp16={"enabled": precision == "fp16"},
        zero_allow_untested_optimizer=True,
    )
    ds.setdefault("steps_per_print", 10**9)
    return ds


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based).

    Warmup: steps ``0..W-1`` ramp ``(s+1)/(W+1)``; the peak is reached at step ``W``. Then ``linear`` falls
    as ``1 - p`` and ``cosine`` as ``(1 + cos(pi p)) / 2`` with ``p = (s - W) / (total - W)`` (so the last
    step still trains); ``constant`` stays at 1.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler {schedule!r}")


class SkippableAdamW(torch.optim.AdamW):
    """AdamW whose ``step()`` is a no-op while ``overflow`` is set.

    Under ZeRO-0 in fp32 DeepSpeed steps the client optimizer directly, with no overflow check of its own; it
    does read ``optimizer.overflow`` afterwards to report the step as skipped and hold the LR schedule.
    """

    overflow = False

    def step(self, closure=None):
        if self.overflow:
            return None
        return super().step(closure)


def build_optimizer(module: torch.nn.Module, optim: OptimConfig, *, offload: bool) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (no weight decay on biases and norms).

    A client ``torch.optim.AdamW`` avoids DeepSpeed's JIT-built fused/cpu Adam; ZeRO-Offload requires
    ``DeepSpeedCPUAdam`` (built on first use, ~50 s on CPU).
    """
    decay, no_decay = [], []
    for param in module.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters")
    groups = [
        {"params": p, "weight_decay": wd} for p, wd in ((decay, optim.weight_decay), (no_decay, 0.0)) if p
    ]
    kwargs = dict(lr=optim.learning_rate, betas=(optim.adam_beta1, optim.adam_beta2))
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, adamw_mode=True, **kwargs)
    return SkippableAdamW(groups, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Model loading: dtype, gradient checkpointing, frozen vision, LoRA


def vision_module_names(model: torch.nn.Module) -> list[str]:
    """Top-level names of the vision encoder modules (e.g. ``model.visual``)."""
    names = [n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in VISION_MODULE_NAMES]
    return [n for n in names if not any(n.startswith(other + ".") for other in names)]


def _in_any(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def load_pretrained(model_cfg: ModelConfig, dtype: torch.dtype) -> torch.nn.Module:
    """``AutoModelForImageTextToText.from_pretrained`` with the configured dtype and attention."""
    from transformers import AutoModelForImageTextToText

    if not model_cfg.name_or_path:
        raise ConfigError("model.name_or_path: empty; name a Hugging Face checkpoint or a local folder")
    return AutoModelForImageTextToText.from_pretrained(
        model_cfg.name_or_path,
        dtype=dtype,
        attn_implementation=model_cfg.attn_implementation,
        trust_remote_code=model_cfg.trust_remote_code,
    )


def prepare_trainable(model: torch.nn.Module, model_cfg: ModelConfig) -> torch.nn.Module:
    """Gradient checkpointing, the vision freeze and LoRA; returns the module to train (PeftModel with LoRA).

    With LoRA, adapters go on the language model's ``lora.target_modules`` only; ``freeze_vision: false``
    trains the whole vision tower as a peft ``modules_to_save`` copy, so disabling the adapters still gives
    the original (reference) vision tower.
    """
    if model_cfg.gradient_checkpointing:  # non-reentrant: works with frozen inputs (LoRA) and ZeRO-3
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vision = vision_module_names(model)
    if not model_cfg.lora.enabled:
        if model_cfg.freeze_vision:
            for name, param in model.named_parameters():
                if _in_any(name, vision):
                    param.requires_grad_(False)
        return model

    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lora = model_cfg.lora
    targets = sorted(
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and name.rsplit(".", 1)[-1] in lora.target_modules
        and not _in_any(name, vision)
    )
    if not targets:
        raise ConfigError(
            f"model.lora.target_modules: none of {lora.target_modules} names a linear layer "
            "of the language model"
        )
    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=None if model_cfg.freeze_vision else vision,
    )
    return get_peft_model(model, peft_config)


def _is_peft(module: torch.nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


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

    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped model (a PeftModel with LoRA): generation, saving, parameter access."""
        return self.deepspeed.module

    @property
    def zero_stage(self) -> int:
        return self.deepspeed.zero_optimization_stage()

    @property
    def is_lora(self) -> bool:
        return _is_peft(self.module)

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

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate one micro-batch's gradient; ``loss`` is its share of the rank's batch loss.

        A non-finite loss is back-propagated as NaN so that the step's overflow check sees it on every stage.
        """
        if self._micro_steps >= self.gradient_accumulation_steps:
            raise RuntimeError(
                f"backward() called more than gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps} times before step()"
            )
        if not bool(torch.isfinite(loss.detach()).all()):
            loss = loss * float("nan")
        self.deepspeed.backward(loss, scale_wrt_gas=False)
        self._micro_steps += 1
        if self._micro_steps < self.gradient_accumulation_steps:
            self.deepspeed.step()  # not a boundary: DeepSpeed only advances its micro-step counter

    def step(self) -> StepResult:
        """Apply the accumulated gradient (clipped to ``optim.max_grad_norm``), or skip it if non-finite."""
        if self._micro_steps != self.gradient_accumulation_steps:
            raise RuntimeError(
                f"step() after {self._micro_steps} backward() calls; one optimizer step takes "
                f"exactly {self.gradient_accumulation_steps} micro-batches"
            )
        self._micro_steps = 0
        learning_rate = self.learning_rate
        optimizer = self.deepspeed.optimizer
        manual = (
            optimizer is self.deepspeed.basic_optimizer
        )  # ZeRO-0 fp32: no DeepSpeed wrapper checks overflow
        if manual:
            grad_norm = _global_norm([p.grad for p in self.module.parameters() if p.grad is not None])
            optimizer.overflow = not math.isfinite(grad_norm)  # DeepSpeed then skips the LR step as well
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
    dist = init_distributed(config.deepspeed.dist_backend)
    on_gpu = dist.device.type == "cuda"
    ds_config = deepspeed_config(config, dist.world_size, on_gpu=on_gpu)
    precision = resolve_precision(config, on_gpu)
    dtype = _PRECISION_DTYPES[precision]
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
