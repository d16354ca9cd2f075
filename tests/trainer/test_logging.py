"""Metrics logging: JSONL lines, TensorBoard scalars, rank-0 only, the W&B error, flat keys."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from vlm_grpoma.config import LoggingConfig
from vlm_grpoma.trainer.logging import METRICS_FILE, TENSORBOARD_DIR, MetricsLogger, flatten, reduce_metrics


def _step_metrics(step: int) -> dict:
    return {
        "reward": {"total_mean": 0.5 * step, "iou_mean": 0.25},
        "time/step_s": 0.1,
        "loss/policy": torch.tensor(1.5),
        "grad/norm": float("nan"),
        "skipped": False,
    }


def test_jsonl_every_step_tensorboard_every_log_every_and_append_on_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = LoggingConfig(output_dir=str(tmp_path), log_every=2, tensorboard=True, progress_bar=True)
    with MetricsLogger(cfg, total_steps=4) as logger:
        for step in (1, 2, 3):
            logger.log(step, _step_metrics(step))
    with MetricsLogger(cfg, total_steps=4, initial_step=3) as logger:  # a resumed run appends
        logger.log(4, _step_metrics(4))

    records = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2] == {
        "step": 3,
        "reward/total_mean": 1.5,
        "reward/iou_mean": 0.25,
        "time/step_s": 0.1,
        "loss/policy": 1.5,
        "grad/norm": None,
        "skipped": False,
    }

    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    rewards = events.Scalars("reward/total_mean")
    assert [e.step for e in rewards] == [2, 4] and [e.value for e in rewards] == pytest.approx([1.0, 2.0])
    assert "grad/norm" not in events.Tags()["scalars"]  # non-finite values are not plotted


def test_other_ranks_write_nothing(tmp_path):
    cfg = LoggingConfig(output_dir=str(tmp_path / "run"), tensorboard=True)
    with MetricsLogger(cfg, total_steps=1, rank=1) as logger:
        logger.log(1, _step_metrics(1))
    assert not (tmp_path / "run").exists()


def test_wandb_requested_but_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    cfg = LoggingConfig(output_dir=str(tmp_path), tensorboard=False, wandb_project="demo", progress_bar=False)
    with pytest.raises(ImportError, match="logging.wandb_project is set but wandb is not installed"):
        MetricsLogger(cfg, total_steps=1)


def test_flatten_and_single_process_reduce():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a/b": 1, "a/c/d": 2, "e": 3}
    assert reduce_metrics({"x": 2.0, "y": math.pi}, "max") == {"x": 2.0, "y": math.pi}


def test_samples_every_n_steps_as_jsonl_and_tensorboard_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vlm_grpoma.trainer.logging import SAMPLES_FILE

    cfg = LoggingConfig(output_dir=str(tmp_path), samples_every=2, tensorboard=True, progress_bar=False)
    sample = {
        "record": "r|1",
        "thought": "look\nleft",
        "answer": "[1]",
        "reward": float("nan"),
        "rewards": {"iou": 0.5},
    }
    with MetricsLogger(cfg, total_steps=4) as logger:
        for step in (1, 2, 3, 4):
            logger.log_samples(step, [sample, {**sample, "reward": 1.0}])
    with MetricsLogger(cfg, total_steps=4, rank=1) as logger:  # other ranks write nothing
        logger.log_samples(2, [sample])
    rows = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 2, 4, 4]
    assert rows[0] == {
        "step": 2,
        "record": "r|1",
        "thought": "look\nleft",
        "answer": "[1]",
        "reward": None,
        "rewards/iou": 0.5,
    }
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("samples/text_summary")
    assert [e.step for e in texts] == [2, 4]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "| r\\|1 | look left | [1] | None |" in table and "| 1.0 |" in table


def test_completion_samples_show_each_thought_before_a_second_answer():
    from types import SimpleNamespace

    from vlm_grpoma.rewards.base import RewardResult
    from vlm_grpoma.trainer.samples import completion_samples

    b_count, k_count, m_count = 2, 3, 2
    tree = SimpleNamespace(
        shape=(b_count, k_count, m_count),
        thought_texts=[[f"t{b}{k}" for k in range(k_count)] for b in range(b_count)],
        answer_texts=[
            [[f"a{b}{k}{m}" for m in range(m_count)] for k in range(k_count)] for b in range(b_count)
        ],
        present=torch.ones(b_count, k_count, m_count, dtype=torch.bool),
    )
    # score_tree order
    flat = [f"{b}{k}{m}" for b in range(b_count) for k in range(k_count) for m in range(m_count)]
    result = RewardResult([float(i) for i in range(len(flat))], {"iou": [i / 10 for i in range(len(flat))]})
    parsed = torch.ones(b_count, k_count, m_count, dtype=torch.bool)
    parsed[0, 1, 0] = False
    records = [SimpleNamespace(id=f"r{b}", prompt=f"p{b}") for b in range(b_count)]
    samples = completion_samples(tree, records, result, parsed, 4)
    assert [s["answer"] for s in samples] == ["a000", "a010", "a020", "a001"]
    for s in samples:  # each sample's reward is the one score_tree computed for that (b, k, m)
        index = flat.index(s["answer"][1:])
        assert s["reward"] == float(index) and s["rewards"] == {"iou": index / 10}
    assert [s["parsed"] for s in samples] == [True, False, True, True]
    tree.present[0, 1, 0] = tree.present[0, 2, 1] = False  # a ragged tree: absent slots are no samples
    samples = completion_samples(tree, records, result, parsed, 4)
    assert [s["answer"] for s in samples] == ["a000", "a020", "a001", "a011"]
    assert all(s["reward"] == float(flat.index(s["answer"][1:])) for s in samples)
    assert samples[0]["thought"] == "t00" and samples[0]["record"] == "r0"
