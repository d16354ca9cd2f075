"""The optimizer and learning-rate schedule of a run: AdamW over the trainable parameters, warmup then
constant, linear or cosine decay."""

from __future__ import annotations

import math

import torch

from vlm_grpoma.config import OptimConfig


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
