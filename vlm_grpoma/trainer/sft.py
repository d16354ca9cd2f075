"""``vlm-grpoma sft``: supervised warm start on ground-truth answers (the paper's SFT baseline, the demo's start).

Each record's target is its reference thought (``meta["thought"]`` when the data has one, e.g. relational
shapes, arithmetic) or a short templated thought naming where the target is (in the model's coordinate frame;
for a short-answer record, the answer), then the ground truth written as this family's answer JSON (a short
answer as its text)::

    <think>The target is near (412, 230).</think><answer>[{"bbox_2d": [380, 200, 444, 260], ...}]</answer>
    <think>7+5=12, 12*3=36, 36-4=32</think><answer>32</answer>

(a prompt that already opened the thought gets ``The target is near (412, 230).\n</think>\n\n<answer>…``).

The loss is the mean negative log-likelihood over the target tokens of a rank's batch (token mean), run on the
same DeepSpeed engine, data order, logging and checkpoints as GRPO-MA training.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from vlm_grpoma.answers import Answer, Boxes, ContactAction, Points, TextAnswer, Trajectory
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.images import load_mask
from vlm_grpoma.datasets.schema import MaskRef, Record, ShortAnswer
from vlm_grpoma.trainer.base import Trainer
from vlm_grpoma.trainer.logging import reduce_metrics
from vlm_grpoma.trainer.logprobs import completion_log_probs
from vlm_grpoma.trainer.micro_batches import micro_batches

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter


def reference_answer(record: Record) -> Answer:
    """The record's ground truth as an answer (a mask becomes its inside pixel nearest the mask's centroid, a
    short answer its text)."""
    gt = record.ground_truth
    if isinstance(gt, ShortAnswer):
        return TextAnswer(gt.answer)
    if not isinstance(gt, MaskRef):
        return gt
    inside = np.argwhere(load_mask(gt.path))
    if not len(inside):
        raise ValueError(f"record {record.id}: mask {gt.path} is empty; nothing to point at")
    centroid = inside.mean(axis=0)
    y, x = inside[np.argmin(((inside - centroid) ** 2).sum(axis=1))]
    return Points(((float(x) + 0.5, float(y) + 0.5),))


def _anchor(answer: Answer) -> tuple[float, float]:
    """The one point a templated thought names: first box centre, first point, trajectory start, contact."""
    if isinstance(answer, Boxes):
        box = answer.boxes[0]
        return (box.x1 + box.x2) / 2, (box.y1 + box.y2) / 2
    if isinstance(answer, (Points, Trajectory)):
        return answer.points[0]
    if isinstance(answer, ContactAction):
        return answer.point
    raise TypeError(f"not an answer: {answer!r}")


def reference_thought(adapter: QwenVLAdapter, record: Record, answer: Answer) -> str:
    """The record's own reference thought (``meta["thought"]``, e.g. relational shapes), else a templated one
    naming where the answer is in the adapter's frame (or, for a short answer, what it is)."""
    if isinstance(record.meta.get("thought"), str) and record.meta["thought"]:
        return record.meta["thought"]
    if isinstance(answer, TextAnswer):
        return f"The answer is {answer.text}."
    frame = adapter.frame(record)
    x, y = _anchor(answer)
    mx, my = x * frame.model_width / frame.width, y * frame.model_height / frame.height
    return f"The target is near ({round(mx)}, {round(my)})."


def target_text(adapter: QwenVLAdapter, record: Record) -> str:
    """Reference thought + ground-truth answer in the adapter's frame, written exactly as the model would write
    it: without ``<think>`` when the prompt already opened the thought."""
    answer = reference_answer(record)
    thought = reference_thought(adapter, record, answer)
    return adapter.thought.completion(thought, adapter.format_answer(answer, record))


class SFTTrainer(Trainer):
    """Teacher-forced cross-entropy on :func:`target_text` completions."""

    command = "sft"

    def __init__(self, config: Config, *, model: torch.nn.Module | None = None) -> None:
        # No KL term in SFT: kl_beta = 0 keeps the engine from building a frozen reference copy.
        super().__init__(replace(config, algorithm=replace(config.algorithm, kl_beta=0.0)), model=model)

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        records = self.next_records()
        prompts = self.adapter.build_inputs(records)
        targets = [
            torch.tensor(
                self.adapter.tokenizer(target_text(self.adapter, r), add_special_tokens=False).input_ids,
                dtype=torch.long,
            )
            for r in records
        ]
        total_tokens = sum(len(t) for t in targets)
        lengths = [len(p.input_ids) + len(t) for p, t in zip(prompts, targets)]
        chunks = micro_batches(lengths, 1, self.config.train)
        if self.config.train.micro_batch_tokens:
            self.engine.plan_step(len(chunks))
        loss_sum = 0.0
        for rows in chunks:
            logp, _ = completion_log_probs(
                self.engine.deepspeed, prompts, rows, [targets[i] for i in rows], self.adapter.tokens
            )
            loss = -logp.sum() / total_tokens
            self.engine.backward(loss)
            loss_sum += float(loss.detach())
        result = self.engine.step()
        metrics = reduce_metrics(
            {
                "sft/nll": loss_sum,
                "sft/target_tokens": float(total_tokens),
                "train/skipped_steps": float(result.skipped),
                "train/learning_rate": result.learning_rate,
            }
        )
        metrics.update(self.gradient_metrics(result.grad_norm))
        metrics["time/step_s"] = time.perf_counter() - start
        return metrics


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma sft`` handler."""
    return SFTTrainer(args.config_obj).run_to_end("sft/nll")
