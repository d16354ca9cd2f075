"""Trainer test helpers, and the per-rank worker that the launcher test runs under ``deepspeed``.

As a script (one process per rank, started by ``launch/train.sh`` with ``TRAIN_SCRIPT`` pointing here)::

    ds_worker.py --config CONFIG.yaml [key=value ...]

it trains ``WORKER_STEPS`` steps with rank-dependent synthetic batches for each ZeRO stage in
``WORKER_STAGES`` and writes, under ``logging.output_dir``: ``params-zero{S}-rank{R}.safetensors`` (the full
trained parameters), ``metrics-rank{R}.json`` (a ``reduce_metrics`` result) and, for the last stage, a
checkpoint whose Hugging Face folder the test reloads.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

VOCAB = 300
SEQ_LEN = 12


def batch_ids(step: int, rank: int, rows: int) -> torch.Tensor:
    """A deterministic batch of token ids for (step, rank)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (rows, SEQ_LEN), generator=gen)


def rng_batch(rows: int) -> torch.Tensor:
    """A batch drawn from the global python, numpy and torch generators (so resume must restore all three)."""
    ids = torch.randint(0, VOCAB - 10, (rows, SEQ_LEN))
    return ids + random.randint(0, 4) + int(np.random.randint(0, 5))


def micro_loss(model, ids: torch.Tensor, batch_rows: int) -> torch.Tensor:
    """Next-token NLL of ``ids`` weighted so that micro-batch losses sum to the batch's token mean."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -logp.sum() / (batch_rows * (SEQ_LEN - 1))


def train_step(engine, ids: torch.Tensor):
    """One optimizer step over ``ids`` (this rank's batch) split into the engine's micro-batches."""
    micro = len(ids) // engine.gradient_accumulation_steps
    for start in range(0, len(ids), micro):
        engine.backward(
            micro_loss(engine.deepspeed, ids[start : start + micro].to(engine.dist.device), len(ids))
        )
    return engine.step()


def full_params(engine) -> dict[str, torch.Tensor]:
    """Every parameter of the unwrapped module, gathered under ZeRO-3, on CPU."""
    with engine.generation() as module:
        return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}


def main(argv: list[str]) -> int:
    from safetensors.torch import save_file

    from vlm_grpoma.config import load_config
    from vlm_grpoma.trainer.checkpoint import TrainerState, save_checkpoint
    from vlm_grpoma.trainer.engine import build_engine
    from vlm_grpoma.trainer.logging import reduce_metrics

    torch.set_num_threads(1)
    if argv[:1] != ["--config"] or len(argv) < 2:
        raise SystemExit("usage: ds_worker.py --config CONFIG.yaml [key=value ...]")
    overrides = argv[2:]
    stages = [int(s) for s in os.environ.get("WORKER_STAGES", "2").split(",")]
    steps = int(os.environ.get("WORKER_STEPS", "3"))
    for stage in stages:
        config = load_config(argv[1], [*overrides, f"deepspeed.zero_stage={stage}"])
        engine = build_engine(config)
        rank, world = engine.dist.rank, engine.dist.world_size
        rows = config.train.prompts_per_step // world
        results = [train_step(engine, batch_ids(step, rank, rows)) for step in range(steps)]
        out = Path(config.logging.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_file(full_params(engine), str(out / f"params-zero{stage}-rank{rank}.safetensors"))
        new_tokens = 2 + 4 * rank  # ranks finish generating at different times (ZeRO-3 must not hang)
        with engine.generation() as module:
            prompt = batch_ids(99, rank, 1).to(engine.dist.device)
            generated = module.generate(
                input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        if stage == stages[-1]:
            save_checkpoint(engine, out, TrainerState(step=steps), keep_last=1)
            reduced = {
                op: reduce_metrics({"rank": float(rank), "one": 1.0}, op) for op in ("mean", "sum", "max")
            }
            record = {
                "reduced": reduced,
                "grad_norms": [r.grad_norm for r in results],
                "world": world,
                "generated": generated.shape[1] - prompt.shape[1],
            }
            (out / f"metrics-rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
