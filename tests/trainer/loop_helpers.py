"""What the GRPO-MA loop tests share: the tiny K=4, M=4 run's overrides and a snapshot of the model's weights.

A plain module beside the tests (like ``length_reward``), not a test module: importing a test module from another
would import it twice and run its reward registrations twice.
"""

from __future__ import annotations

import torch
from length_reward import AnswerLength  # noqa: F401  (registers test_answer_length, which the overrides use)

from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer


def overrides(data_path, *extra):
    """The loop tests' run: the length reward plus format, K=4 thoughts of 12 tokens, M=4 answers of 8."""
    return (
        f"data.train_path={data_path}",
        "rewards.weights={test_answer_length: 1.0, format: 0.5}",
        "rollout.num_thoughts=4",
        "rollout.answers_per_thought=4",
        "rollout.max_thought_tokens=12",
        "rollout.max_answer_tokens=8",
        *extra,
    )


def parameters(trainer: GRPOMATrainer) -> dict[str, torch.Tensor]:
    """A detached copy of every trainable weight, to tell whether a step changed them."""
    return {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
