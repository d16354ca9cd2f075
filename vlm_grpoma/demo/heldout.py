"""Greedy held-out evaluation of one checkpoint, episode by episode: the demo's before/after numbers.

It decodes and scores exactly as the trainer's ``train.eval_every`` evaluation does (same greedy sampling
parameters, batches of ``train.eval_batch_prompts`` in record order, same rewards), so a checkpoint's numbers
here equal that run's logged ``eval/<set>/...`` metrics; it also keeps each episode's answer and outcome,
which the paired comparison and the contact grid need.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from vlm_grpoma.answers import Answer, ParseError
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.eval.proportions import Rate, wilson
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.scoring import score_tree

if TYPE_CHECKING:
    from vlm_grpoma.rewards.base import Reward


@dataclass(frozen=True)
class Episode:
    """One held-out record: the model's greedy answer (or why it did not parse) and whether it succeeded."""

    record: Record
    answer: Answer | ParseError
    success: bool


@dataclass(frozen=True)
class SetResult:
    """A checkpoint's episodes on one held-out set, in record order."""

    name: str
    episodes: tuple[Episode, ...]

    @property
    def rate(self) -> Rate:
        return wilson(sum(e.success for e in self.episodes), len(self.episodes))

    @property
    def parsed(self) -> int:
        return sum(not isinstance(e.answer, ParseError) for e in self.episodes)

    def parse_failures(self) -> dict[str, int]:
        """How many answers failed to parse, by reason (``out_of_bounds``, ``invalid_json``, ...), most first."""
        reasons = Counter(e.answer.reason for e in self.episodes if isinstance(e.answer, ParseError))
        return dict(reasons.most_common())


def evaluate_checkpoint(
    config: Config,
    model_dir: Path,
    sets: dict[str, list[Record]],
    rewards: Reward,
    success_key: str,
    label: str,
) -> dict[str, SetResult]:
    """Greedy answers of the model in ``model_dir`` on every set, scored by ``rewards``; an episode succeeded
    when its ``success_key`` component (e.g. ``manipulation/success``) is positive."""
    loaded = load_model(replace(config.model, name_or_path=str(model_dir)))
    adapter = loaded.adapter
    rollout = HFRolloutEngine.for_adapter(loaded.model.eval(), adapter)
    params = SamplingParams.from_config(config.rollout, config.seed, greedy=True)
    size = config.train.eval_batch_prompts
    results = {}
    with tqdm(total=sum(map(len, sets.values())), desc=f"eval {label}", unit="episode") as bar:
        for name, records in sets.items():
            episodes = []
            for start in range(0, len(records), size):
                chunk = records[start : start + size]
                tree = rollout.sample(adapter.build_inputs(chunk), params)
                scored = score_tree(tree, chunk, adapter, rewards)
                success = scored.result.components[success_key]
                for b, record in enumerate(chunk):
                    first = scored.index(b, 0, 0)
                    episodes.append(Episode(record, scored.completions[first].answer, success[first] > 0))
                bar.update(len(chunk))
            results[name] = SetResult(name, tuple(episodes))
    return results
