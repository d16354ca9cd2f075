"""Per-rank worker of ``test_elastic_resume.py``: ``vlm-grpoma train`` (GRPOMATrainer, resume included) that also
writes out the full optimizer state, gathered with DeepSpeed's own accessors, after start-up and after training.

As a script (one process per rank, started by ``launch/train.sh`` with ``TRAIN_SCRIPT`` pointing here)::

    elastic_worker.py --config CONFIG.yaml [key=value ...]

writes ``<logging.output_dir>/state-<ELASTIC_TAG>-{started,trained}.pt`` on rank 0 (started: resumed runs only): per trainable parameter
its fp32 value, ``exp_avg`` and ``exp_avg_sq`` (full tensors, not partitions), the optimizer's step count,
DeepSpeed's step counter, the LR scheduler's epoch and the trainer's step and data position.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch


def _full_moment(param, optimizer, key: str) -> torch.Tensor:
    """ZeRO 1/2: the whole ``key`` moment of ``param``, each rank's fragment read from the base optimizer's flat
    partition and summed over the ranks. (DeepSpeed's ``safe_get_full_optimizer_state`` misses every param group
    but the first: it links their moments once, after the first group's first step.)"""
    buffer = torch.zeros(param.numel(), dtype=torch.float32)
    mapping = param._hp_mapping
    if mapping is not None:
        flat = optimizer.single_partition_of_fp32_groups[mapping.param_group_index]
        hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
        fragment = optimizer.optimizer.state[flat][key].narrow(0, hp.start, hp.numel)
        buffer.narrow(0, lp.start, lp.numel).copy_(fragment)
    torch.distributed.all_reduce(buffer)
    return buffer.view_as(param)


def full_state(trainer) -> dict:
    """The trainer's full optimizer state (every rank calls: ZeRO gathers)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    engine = trainer.engine
    optimizer = engine.deepspeed.optimizer
    params, steps = {}, set()
    for name, param in engine.module.named_parameters():
        if not param.requires_grad:
            continue
        if engine.zero_stage == 0:  # torch's AdamW itself, state per parameter
            state = optimizer.state[param]
            value, moments = param.detach(), (state["exp_avg"], state["exp_avg_sq"])
            steps.add(int(state["step"]))
        else:
            value = safe_get_full_fp32_param(param)
            full = (
                _full_moment if engine.zero_stage < 3 else lambda p, _, k: safe_get_full_optimizer_state(p, k)
            )
            moments = tuple(full(param, optimizer, key) for key in ("exp_avg", "exp_avg_sq"))
        params[name] = {
            "fp32": value.detach().cpu().clone(),
            "exp_avg": moments[0].cpu().clone(),
            "exp_avg_sq": moments[1].cpu().clone(),
        }
    if engine.zero_stage:
        steps = {int(s["step"]) for s in optimizer.optimizer.state.values()}
    return {
        "params": params,
        "adam_steps": sorted(steps),
        "global_steps": engine.optimizer_steps,
        "lr_epoch": engine.deepspeed.lr_scheduler.last_epoch,
        "trainer_step": trainer.step,
        "data": trainer.sampler.state_dict(),
    }


def main(argv: list[str]) -> int:
    from vlm_grpoma.config import load_config
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    torch.set_num_threads(1)
    config = load_config(argv[1], argv[2:])
    trainer = GRPOMATrainer(config)
    out, tag = Path(config.logging.output_dir), os.environ["ELASTIC_TAG"]
    for when in ("started", "trained"):
        if when == "trained":
            trainer.train()
        elif trainer.step == 0:
            continue  # a fresh run has no optimizer state yet
        state = full_state(trainer)
        if trainer.dist.is_main:
            torch.save(state, out / f"state-{tag}-{when}.pt")
    trainer.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
