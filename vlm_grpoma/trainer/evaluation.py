"""Held-out evaluation during GRPO-MA training.

It decodes one greedy thought + answer per record of each ``data.eval_sets`` entry with the rollout
backend the trainer samples with, scores it with the training rewards (so ``eval/seen/success_mean`` of a
manipulation run is SAPIEN success on held-out instances) and logs ``eval/<set>/<name>`` metrics summed over
ranks: ``reward_mean``, one ``<component>_mean`` per reward component, ``parse_rate`` and ``records``. A
non-finite reward counts as 0 in the means and is counted in ``reward_non_finite``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vlm_grpoma.config import Config
from vlm_grpoma.datasets.jsonl import RecordError, read_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError, DataError
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logging import sum_over_ranks
from vlm_grpoma.trainer.scoring import score_tree

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rewards.base import Reward
    from vlm_grpoma.rollout.base import RolloutEngine

_SET_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class EvalSet:
    """One named held-out set: the records of the training task found in its file."""

    name: str
    records: list[Record]


def load_eval_sets(config: Config) -> list[EvalSet]:
    """Read ``data.eval_sets`` (only when ``train.eval_every`` > 0); bad names or files fail with one line."""
    if not config.train.eval_every:
        return []
    sets = []
    for name, path in config.data.eval_sets.items():
        key = f"data.eval_sets.{name}"
        if not _SET_NAME.fullmatch(name):
            raise ConfigError(f"{key}: set names become metric keys; use letters, digits, '_', '-' or '.'")
        try:
            records = read_records(
                path,
                skip_bad=config.data.skip_bad_records,
                check_images=True,
                image_root=config.data.image_root,
            )
        except RecordError as err:
            raise DataError(f"{key}: {err}") from None
        kept = [r for r in records if r.task == config.data.task]
        if not kept:
            raise DataError(f"{key}: {path} has no {config.data.task} records (data.task)")
        sets.append(EvalSet(name, kept))
    return sets


def _equal_shard(records: Sequence[Record], rank: int, world_size: int) -> tuple[list[Record], int]:
    """This rank's records, padded by repeating one so every rank makes the same rollout calls (ZeRO-3 gathers
    parameters collectively around each call); returns the padded shard and how many entries are real."""
    shard = list(records[rank::world_size])
    size = -(-len(records) // world_size)
    return shard + [records[rank % len(records)]] * (size - len(shard)), len(shard)


def evaluate_sets(
    sets: Sequence[EvalSet],
    rollout: RolloutEngine,
    adapter: QwenVLAdapter,
    rewards: Reward,
    params: SamplingParams,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
) -> dict[str, float]:
    """Greedy answers for this rank's share of every set, scored, then summed over ranks into means."""
    metrics: dict[str, float] = {}
    for eval_set in sets:
        shard, real = _equal_shard(eval_set.records, rank, world_size)
        sums: dict[str, float] = {"records": float(real), "parsed": 0.0, "reward": 0.0}
        for start in range(0, len(shard), batch_size):
            chunk = shard[start : start + batch_size]
            tree = rollout.sample(adapter.build_inputs(chunk), params)
            keep = max(0, min(len(chunk), real - start))  # padding entries are decoded but not counted
            scored = score_tree(tree, chunk, adapter, rewards)
            sums["parsed"] += float(scored.parsed.flatten()[:keep].sum())
            kept = scored.rewards.flatten()[:keep]
            sums["reward"] += float(kept.nansum())
            sums["non_finite"] = sums.get("non_finite", 0.0) + float((~torch.isfinite(kept)).sum())
            for name, values in scored.result.components.items():
                sums[name] = sums.get(name, 0.0) + float(
                    torch.tensor(values[:keep], dtype=torch.float64).nansum()
                )
        totals_over_ranks = sum_over_ranks(sums)
        count = max(totals_over_ranks.pop("records"), 1.0)
        prefix = f"eval/{eval_set.name}"
        metrics[f"{prefix}/records"] = count
        metrics[f"{prefix}/parse_rate"] = totals_over_ranks.pop("parsed") / count
        metrics[f"{prefix}/reward_non_finite"] = totals_over_ranks.pop("non_finite", 0.0)
        metrics[f"{prefix}/reward_mean"] = totals_over_ranks.pop("reward") / count
        metrics.update({f"{prefix}/{name}_mean": value / count for name, value in totals_over_ranks.items()})
    return metrics
