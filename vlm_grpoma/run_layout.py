"""The names inside a run's output folder (``logging.output_dir``), defined once: the trainer writes them; resume,
``eval``, ``manip-eval``, the demo and the benchmarks read them.

    <output_dir>/
      .vlm-grpoma.lock            the running job's lock (flock)
      config.yaml                 the resolved config of the latest start
      metrics.jsonl               one JSON row per step
      samples.jsonl               sampled completions with their rewards
      tensorboard/                TensorBoard events
      checkpoints/
        step-00000010/            a complete checkpoint: checkpoint.json is written last
          model/                  Hugging Face folder (full weights or LoRA adapter) + processor
          deepspeed/              DeepSpeed's state (trainable parameters, optimizer, scheduler)
          rng/rank-00000.pt       each rank's RNG states
          trainer_state.pt        step, data position, metric trackers
          checkpoint.json         format, step, world size, manifest
          universal/              DeepSpeed's universal copy, made by an elastic resume at another world size
        .tmp-step-…               being written
        .old-step-…               the previous copy of a step during its re-save
        damaged-step-…            failed verification: never resumed from, never pruned
        abandoned-step-…          later than the checkpoint a run went back to: never resumed from, never pruned
      eval-<split>-step-N/        ``eval`` results of one split for the checkpoint of step N
      eval-summary-step-N.json    ``eval``'s summary across those splits
"""

from __future__ import annotations

import re
from pathlib import Path

LOCK_FILE = ".vlm-grpoma.lock"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS_DIR = "checkpoints"

MODEL_DIR = "model"
DEEPSPEED_DIR = "deepspeed"
RNG_DIR = "rng"
TRAINER_STATE_FILE = "trainer_state.pt"
META_FILE = "checkpoint.json"
UNIVERSAL_DIR = "universal"

STEP_PREFIX = "step-"
#: Every name a complete or incomplete step folder may have (``step-00000010``).
STEP_GLOB = f"{STEP_PREFIX}*"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
DAMAGED_PREFIX = "damaged-"
ABANDONED_PREFIX = "abandoned-"
EVAL_PREFIX = "eval-"

_STEP_NAME = re.compile(rf"^(?:{re.escape(OLD_PREFIX)})?{STEP_PREFIX}(\d+)$")


def checkpoint_name(step: int) -> str:
    """``step-00000010``: zero-padded, so name order is step order."""
    return f"{STEP_PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    """The step of a ``step-N`` (or ``.old-step-N``) folder name; None for any other name."""
    found = _STEP_NAME.match(name)
    return int(found.group(1)) if found else None


def checkpoint_root(output_dir: str | Path) -> Path:
    """``<output_dir>/checkpoints``."""
    return Path(output_dir) / CHECKPOINTS_DIR


def rng_file(rank: int) -> str:
    """A rank's RNG file inside a checkpoint folder (``rng/rank-00000.pt``)."""
    return f"{RNG_DIR}/rank-{rank:05d}.pt"


def _step_tag(step: int | None) -> str:
    return "" if step is None else f"-step-{step}"


def eval_dir_name(split: str, step: int | None = None) -> str:
    """``eval-<split>-step-N`` (``eval-<split>`` for a model outside a run): the folder ``eval`` writes one
    split's results to, one per checkpoint step so two checkpoints never share it."""
    return f"{EVAL_PREFIX}{split}{_step_tag(step)}"


def eval_summary_name(step: int | None = None) -> str:
    """``eval-summary-step-N.json``: ``eval``'s summary across the splits of one checkpoint."""
    return f"{EVAL_PREFIX}summary{_step_tag(step)}.json"
