"""What every training run shares (GRPO-MA and SFT): engine, adapter, records, data order, GSS tracking,
metrics logging, checkpoints and exact resume. Subclasses implement :meth:`Trainer.train_step`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from vlm_grpoma.algorithm import GradientSpikeTracker
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.jsonl import RecordError, read_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import CommandError
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.trainer.checkpoint import (
    TrainerState,
    checkpoint_bytes,
    checkpoint_name,
    checkpoint_root,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from vlm_grpoma.trainer.data import PromptSampler
from vlm_grpoma.trainer.engine import TrainingEngine, build_engine
from vlm_grpoma.trainer.logging import MetricsLogger, reduce_metrics


def _checked(action):
    """Run ``action``; a bad checkpoint or data position becomes one clear CLI error line."""
    try:
        return action()
    except (FileNotFoundError, ValueError) as err:
        raise CommandError(f"checkpoint.resume: {err}") from None


def training_records(config: Config) -> list[Record]:
    """The records of ``data.train_path`` with ``data.task`` and ``data.train_split`` (bad data: one clear line)."""
    try:
        records = read_records(config.data.train_path, skip_bad=config.data.skip_bad_records)
    except RecordError as err:
        raise CommandError(f"data.train_path: {err}") from None
    data = config.data
    kept = [r for r in records if r.task == data.task and r.split == data.train_split]
    if not kept:
        found = Counter((r.task, r.split) for r in records)
        raise CommandError(
            f"data.train_path: {data.train_path} has no {data.task} records of split "
            f"{data.train_split!r} (data.task, data.train_split); it has "
            + ", ".join(f"{n} {task}/{split}" for (task, split), n in sorted(found.items()))
        )
    return kept


class Trainer:
    """Set up (or resume) a run; :meth:`train` calls :meth:`train_step` until ``train.steps``."""

    def __init__(self, config: Config, *, model: torch.nn.Module | None = None) -> None:
        if not config.data.train_path:
            raise CommandError(
                "data.train_path is empty: point it at a records.jsonl (see vlm-grpoma make-data)"
            )
        self.config = config
        self.records = training_records(config)
        resume = _checked(lambda: resolve_resume(config.checkpoint.resume, config.logging.output_dir))
        self.engine: TrainingEngine = build_engine(config, model)
        self.dist = self.engine.dist
        self.adapter = load_adapter(config.model)
        self.sampler = PromptSampler(
            len(self.records), config.train.prompts_per_step, config.seed, config.data.shuffle
        )
        self.gss = GradientSpikeTracker()
        self.step = 0
        self.trained_seconds = 0.0  # time spent in training steps so far (train.time_budget_s counts it)
        if resume is not None:
            state = _checked(lambda: load_checkpoint(self.engine, resume))
            self.step = state.step
            _checked(lambda: self.sampler.load_state_dict(state.data))
            self.gss.load_state_dict(state.metrics["gss"])
            self.trained_seconds = float(state.metrics.get("trained_seconds", 0.0))
        self.logger = MetricsLogger(
            config.logging,
            total_steps=config.train.steps,
            initial_step=self.step,
            run_config=config.to_dict(),
            rank=self.dist.rank,
        )

    def next_records(self) -> list[Record]:
        """This rank's share of the next step's prompts."""
        indices = PromptSampler.shard(self.sampler.next_step(), self.dist.rank, self.dist.world_size)
        return [self.records[i] for i in indices]

    def gradient_metrics(self, grad_norm: float) -> dict[str, float]:
        """Advance the step counter and report the gradient norm with its spike score (GSS, GSS@10)."""
        self.step += 1
        return {
            "train/grad_norm": grad_norm,
            "train/gss": self.gss.update(grad_norm),
            "train/gss10_count": float(self.gss.spikes),
            "train/gss10_fraction": self.gss.spike_fraction,
        }

    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def evaluation(self, final: bool = False) -> dict[str, float]:
        """Held-out metrics due at the current step ({} when none are; ``final``: the run stops after this step);
        see :class:`~vlm_grpoma.trainer.grpo_ma.GRPOMATrainer`."""
        return {}

    def budget_spent(self) -> bool:
        """``train.time_budget_s`` is used up (decided alike on every rank: the slowest rank's time counts)."""
        budget = self.config.train.time_budget_s
        return bool(budget) and reduce_metrics({"s": self.trained_seconds}, "max")["s"] >= budget

    def save(self) -> Path:
        """Write the checkpoint of the current step; rank 0 prints its size on disk."""
        path = save_checkpoint(
            self.engine,
            self.config.logging.output_dir,
            TrainerState(
                step=self.step,
                data=self.sampler.state_dict(),
                metrics={"gss": self.gss.state_dict(), "trained_seconds": self.trained_seconds},
            ),
            processor=self.adapter.processor,
            keep_last=self.config.checkpoint.keep_last,
            merge_lora=self.config.checkpoint.merge_lora,
        )
        if self.dist.is_main:
            sizes = checkpoint_bytes(path)
            print(
                f"checkpoint {path}: {sizes['total'] / 2**20:.1f} MiB (model/ {sizes['model'] / 2**20:.1f} MiB, "
                f"deepspeed/ {sizes['deepspeed'] / 2**20:.1f} MiB; frozen parameters are not saved)",
                flush=True,
            )
        return path

    @property
    def final_model_dir(self) -> Path:
        """The Hugging Face folder of the last checkpoint (what ``model.name_or_path`` of a next stage takes)."""
        return checkpoint_root(self.config.logging.output_dir) / checkpoint_name(self.step) / "model"

    def train(self) -> list[dict[str, float]]:
        """Train until ``train.steps`` (or ``train.time_budget_s``); checkpoint every ``checkpoint.save_every``
        steps and at the end."""
        history = []
        try:
            if self.step == 0 and (before := self.evaluation()):
                self.logger.log(0, before)  # step 0: the starting model's held-out metrics only
            final = self.step >= self.config.train.steps
            while not final:
                metrics = self.train_step()
                self.trained_seconds += metrics["time/step_s"]
                final = self.step >= self.config.train.steps or self.budget_spent()
                metrics["time/trained_s"] = self.trained_seconds
                metrics.update(self.evaluation(final))
                self.logger.log(self.step, metrics)
                history.append(metrics)
                every = self.config.checkpoint.save_every
                if every and self.step % every == 0 and not final:
                    self.save()
            self.save()
        finally:
            self.logger.close()
        return history

    def run_to_end(self, headline: str) -> int:
        """CLI body: train, print a one-line summary on rank 0, release ZeRO-3 state; exit code 0."""
        history = self.train()
        if self.dist.is_main and history:
            last = history[-1]
            print(
                f"trained {self.step} steps; last {headline} {last[headline]:.3f}, {last['time/step_s']:.2f} "
                f"s/step; model in {self.final_model_dir}"
            )
        self.engine.close()
        return 0
