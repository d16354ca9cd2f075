"""One rank of the launch tests: the real GRPO-MA trainer, then this rank's own view of the job.

Started by ``launch/train.sh`` (``TRAIN_SCRIPT`` pointing here) with the arguments of ``vlm-grpoma train``::

    node_worker.py --config CONFIG.yaml [key=value ...]

It trains exactly as ``vlm-grpoma train`` does (same config validation, same :class:`GRPOMATrainer`), with one
extra reward a random tiny model's samples vary on (``launch_test_answer_length``: longer answers score more,
so every step has a real, rank-dependent gradient to all-reduce), then writes into ``$NODE_CHECK_DIR``: ``rank-{R}.safetensors`` (this rank's full parameters after training) and
``rank-{R}.json`` (the process group as this rank saw it, the launcher's environment, its network namespace).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward


class AnswerLength:
    def score(self, completions, records):
        return RewardResult([min(len(c.answer_text), 40) / 40 for c in completions], {})


def main(argv: list[str]) -> int:
    from safetensors.torch import save_file

    from vlm_grpoma.config import load_config, validate
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    torch.set_num_threads(1)
    register_reward("launch_test_answer_length", AnswerLength)
    if argv[:1] != ["--config"] or len(argv) < 2:
        raise SystemExit("usage: node_worker.py --config CONFIG.yaml [key=value ...]")
    config = load_config(argv[1], argv[2:])
    validate(config, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    trainer = GRPOMATrainer(config)
    trainer.train()
    rank = torch.distributed.get_rank()
    out = Path(os.environ["NODE_CHECK_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    params = {name: p.detach().cpu().clone() for name, p in trainer.engine.module.named_parameters()}
    save_file(params, str(out / f"rank-{rank}.safetensors"))
    seen = {
        "rank": rank,
        "world_size": torch.distributed.get_world_size(),
        "backend": torch.distributed.get_backend(),
        "steps": trainer.step,
        "netns": os.readlink("/proc/self/ns/net"),
        "env": {
            key: os.environ.get(key)
            for key in (
                "NODE_RANK",
                "CROSS_RANK",
                "CROSS_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "HOSTFILE",
            )
        },
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    trainer.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
