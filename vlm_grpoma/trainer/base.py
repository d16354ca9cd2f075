"""What every training run shares (GRPO-MA and SFT): the output folder, engine, adapter, records, data order,
GSS tracking, metrics logging, checkpoints and exact resume. Subclasses implement :meth:`Trainer.train_step`.

Start-up order, cheapest checks first, each failure one line on every rank: process group; output folder
(lock, no other run's results unless resuming, ``config.yaml``); records and their images; the records this
model cannot take (prompt length, image size), in the training and the held-out sets; the checkpoint to resume
from, verified; only then the model.
"""

from __future__ import annotations

import logging
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from vlm_grpoma.algorithm import GradientSpikeTracker
from vlm_grpoma.config import Config, check_optional_dependencies
from vlm_grpoma.datasets.jsonl import RecordError, read_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.distributed import init_distributed
from vlm_grpoma.errors import CheckpointError, ConfigError, DataError, DistributedError, UserError
from vlm_grpoma.models.prompts import prompt_text
from vlm_grpoma.models.record_checks import screen_records
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.run_layout import MODEL_DIR, TRAINER_STATE_FILE
from vlm_grpoma.trainer.checkpoint import (
    TrainerState,
    check_checkpoint_folder,
    checkpoint_bytes,
    checkpoint_name,
    checkpoint_root,
    choose_checkpoint,
    load_checkpoint,
    resume_plan,
    save_checkpoint,
)
from vlm_grpoma.trainer.collectives import barrier, collective, raise_on_every_rank
from vlm_grpoma.trainer.engine import TrainingEngine, build_engine
from vlm_grpoma.trainer.evaluation import EvalSet
from vlm_grpoma.trainer.logging import MetricsLogger, reduce_metrics
from vlm_grpoma.trainer.parse_watch import ParseRateWatch
from vlm_grpoma.trainer.run_dir import OutputLock, refuse_foreign_run, write_config
from vlm_grpoma.trainer.sampler import PromptSampler
from vlm_grpoma.trainer.stop_signals import STOPPED_EXIT_CODE, StopRequest

log = logging.getLogger(__name__)


def training_records(config: Config) -> list[Record]:
    """The records of ``data.train_path`` with ``data.task`` and ``data.train_split``, images checked (bad data:
    one clear line)."""
    data = config.data
    try:
        records = read_records(
            data.train_path, skip_bad=data.skip_bad_records, check_images=True, image_root=data.image_root
        )
    except RecordError as err:
        raise DataError(f"data.train_path: {err}") from None
    kept = [r for r in records if r.task == data.task and r.split == data.train_split]
    if not kept:
        found = Counter((r.task, r.split) for r in records)
        has = ", ".join(f"{n} {task}/{split}" for (task, split), n in sorted(found.items()))
        raise DataError(
            f"data.train_path: {data.train_path} has no {data.task} records of split {data.train_split!r} "
            f"(data.task, data.train_split); it has {has or 'no valid records'}"
        )
    return kept


def _fingerprint(records: list[Record]) -> tuple[int, int]:
    """(count, CRC of the ids): equal on every rank unless they read different data."""
    return len(records), zlib.crc32("\n".join(r.id for r in records).encode())


class Trainer(ABC):
    """Set up (or resume) a run; :meth:`train` calls :meth:`train_step` until ``train.steps``.

    ``held_out``: the held-out sets a subclass evaluates on, screened here like the training records
    (``eval_sets``)."""

    #: the CLI command this trainer runs (``train``, ``sft``): which optional packages its config may need
    command: str

    def __init__(
        self, config: Config, *, model: torch.nn.Module | None = None, held_out: Sequence[EvalSet] = ()
    ) -> None:
        if not config.data.train_path:
            raise ConfigError(
                "data.train_path: is empty; point it at a records.jsonl (see vlm-grpoma make-data)"
            )
        check_optional_dependencies(config, self.command)  # the Python API gets the CLI's early check
        self.config = config
        timeout = config.train.dist_timeout_s
        self.dist = init_distributed(config.deepspeed.dist_backend, timeout)
        self._lock: OutputLock | None = None
        try:
            self._claim_output_dir()
            self.adapter = load_adapter(config.model)
            self.adapter.prompt_text = prompt_text(config.data)
            self.records = self._load_records()
            self.eval_sets = self._screen_held_out(held_out)
            resume = choose_checkpoint(config.checkpoint.resume, config.logging.output_dir, timeout)
            if resume is not None:
                resume_plan(config, self.dist.world_size, resume)  # another world size or stage: said now
            self.engine: TrainingEngine = build_engine(config, model)
            self.sampler = PromptSampler(
                len(self.records), config.train.prompts_per_step, config.seed, config.data.shuffle
            )
            self.gss = GradientSpikeTracker()
            self.parse_watch = ParseRateWatch()  # a resumed run's start is where it resumed
            self.step = self.skipped_steps = 0
            self.trained_seconds = 0.0  # time spent in training steps so far (train.time_budget_s counts it)
            #: the step whose checkpoint the output folder holds (no need to save it again)
            self._saved_step: int | None = None
            #: the signal that stopped :meth:`train` early (after saving), if one did
            self.stopped_by: str | None = None
            if resume is not None:
                self._resume(resume)
            self.logger = MetricsLogger(
                config.logging,
                total_steps=config.train.steps,
                initial_step=self.step,
                run_config=config.to_dict(),
                rank=self.dist.rank,
            )
        except BaseException:
            self._release()
            raise

    # -- start-up ---------------------------------------------------------------------------------------------

    def _claim_output_dir(self) -> None:
        """Rank 0 locks the output folder, refuses another run's results unless resuming, saves config.yaml."""
        out, error = self.config.logging.output_dir, None
        if self.dist.is_main:
            try:
                self._lock = OutputLock(out)
                check_checkpoint_folder(out)
                refuse_foreign_run(out, self.config.checkpoint.resume)
                write_config(out, self.config.to_dict())
            except UserError as err:
                error = err
        raise_on_every_rank(
            error, "the start-up check of the output folder", self.config.train.dist_timeout_s
        )

    def _load_records(self) -> list[Record]:
        """Training records, checked against this model's limits; every rank must end up with the same ones."""
        config, error, records = self.config, None, []
        try:
            records = screen_records(
                training_records(config),
                self.adapter,
                config.data.max_prompt_tokens,
                source=f"data.train_path: {config.data.train_path}",
                skip_bad=config.data.skip_bad_records,
            )
            if not records:
                raise DataError(f"data.train_path: {config.data.train_path}: no record is left to train on")
        except UserError as err:
            error = err
        raise_on_every_rank(error, "the start-up check of the records", config.train.dist_timeout_s)
        if self.dist.world_size > 1:
            prints: list = [None] * self.dist.world_size
            with collective("the start-up check of the records", config.train.dist_timeout_s):
                torch.distributed.all_gather_object(prints, _fingerprint(records))
            if len(set(prints)) > 1:
                raise DataError(
                    f"data.train_path: the ranks read different records ({prints}); was "
                    f"{config.data.train_path} or an image changed during start-up?"
                )
        return records

    def _screen_held_out(self, sets: Sequence[EvalSet]) -> list[EvalSet]:
        """The held-out sets, like the training records, hold only records this model can take."""
        data = self.config.data
        return [
            EvalSet(
                s.name,
                screen_records(
                    s.records,
                    self.adapter,
                    data.max_prompt_tokens,
                    source=f"data.eval_sets.{s.name}: {data.eval_sets[s.name]}",
                    skip_bad=data.skip_bad_records,
                ),
            )
            for s in sets
        ]

    def _resume(self, path: Path) -> None:
        state = load_checkpoint(self.engine, path)
        self.step = state.step
        try:
            self.sampler.load_state_dict(state.data)
        except ValueError as err:
            raise ConfigError(f"checkpoint.resume: {path}: {err}") from None
        except (KeyError, TypeError) as err:
            raise CheckpointError(
                f"{path / TRAINER_STATE_FILE}: damaged data position ({type(err).__name__}: {err})"
            ) from None
        try:
            self.gss.load_state_dict(state.metrics["gss"])
            self.skipped_steps = int(state.metrics.get("skipped_steps", 0))
            self.trained_seconds = float(state.metrics.get("trained_seconds", 0.0))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(
                f"{path / TRAINER_STATE_FILE}: damaged metric trackers ({type(err).__name__}: {err})"
            ) from None
        if path.parent.resolve() == checkpoint_root(self.config.logging.output_dir).resolve():
            self._saved_step = state.step
        if self.dist.is_main:
            print(f"resumed from {path} (step {state.step} of {self.config.train.steps})", flush=True)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- steps ------------------------------------------------------------------------------------------------

    def next_records(self) -> list[Record]:
        """This rank's share of the next step's prompts."""
        indices = PromptSampler.shard(self.sampler.next_step(), self.dist.rank, self.dist.world_size)
        return [self.records[i] for i in indices]

    def data_state(self) -> dict:
        """The data position a checkpoint saves: the next prompts a resumed run draws."""
        return self.sampler.state_dict()

    def gradient_metrics(self, grad_norm: float) -> dict[str, float]:
        """The step's gradient norm with its running spike score (the run's GSS comes with the final step's
        metrics, see :class:`~vlm_grpoma.algorithm.GradientSpikeTracker`)."""
        return {
            "train/grad_norm": grad_norm,
            "train/gss_running": self.gss.update(grad_norm),
            "train/gss_running10_count": float(self.gss.spikes),
        }

    @abstractmethod
    def train_step(self) -> dict[str, float]:
        """Run one training step on this rank's share of the prompts; returns the metrics (all ranks)."""

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
                data=self.data_state(),
                metrics={
                    "gss": self.gss.state_dict(),
                    "skipped_steps": self.skipped_steps,
                    "trained_seconds": self.trained_seconds,
                },
            ),
            processor=self.adapter.processor,
            keep_last=self.config.checkpoint.keep_last,
            merge_lora=self.config.checkpoint.merge_lora,
        )
        self._saved_step = self.step
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
        return checkpoint_root(self.config.logging.output_dir) / checkpoint_name(self.step) / MODEL_DIR

    def _step_once(self) -> tuple[dict[str, float], bool]:
        """One training step plus its due evaluation, and whether it is the last one (``train.steps`` or the
        time budget reached); a lost rank is named with the step."""
        try:
            with collective(
                f"a collective of training step {self.step + 1}", self.config.train.dist_timeout_s
            ):
                metrics = self.train_step()
                self.step += 1
                self.trained_seconds += metrics["time/step_s"]
                metrics["time/trained_s"] = self.trained_seconds
                final = self.step >= self.config.train.steps or self.budget_spent()
                if final:
                    metrics.update(self.gss.run_metrics())
                metrics.update(self.evaluation(final))
        except DistributedError as err:
            raise DistributedError(f"step {self.step + 1}: {err}") from None
        if metrics.get("train/skipped_steps", 0) > 0:
            self.skipped_steps += 1
            if self.dist.is_main:
                log.warning(
                    "step %d: optimizer step skipped, the loss or gradient was not finite; weights unchanged",
                    self.step,
                )
        return metrics, final

    def _watch_parse_rates(self, step: int, metrics: dict[str, float]) -> None:
        """Warn (main rank, once per rate) when answers stop parsing: :mod:`~vlm_grpoma.trainer.parse_watch`."""
        if self.dist.is_main:
            for line in self.parse_watch.observe(step, metrics):
                log.warning(line)

    def _stop_requested(self, stop: StopRequest) -> bool:
        """A stop signal reached this rank or another one (decided alike on every rank)."""
        asked = stop.signal_name is not None
        if self.dist.world_size == 1:
            return asked
        return reduce_metrics({"stop": float(asked)}, "max", self.config.train.dist_timeout_s)["stop"] > 0

    def train(self) -> list[dict[str, float]]:
        """Train until ``train.steps`` (or ``train.time_budget_s``, or a stop signal: see
        :mod:`~vlm_grpoma.trainer.stop_signals`); checkpoint every ``checkpoint.save_every`` steps and at the end."""
        history = []
        try:
            with StopRequest() as stop:
                if self.step == 0 and (before := self.evaluation()):
                    self.logger.log(0, before)  # step 0: the starting model's held-out metrics only
                    self._watch_parse_rates(0, before)
                final = self.step >= self.config.train.steps
                while not final:
                    metrics, final = self._step_once()
                    self.logger.log(self.step, metrics)
                    self._watch_parse_rates(self.step, metrics)
                    history.append(metrics)
                    if not final and self._stop_requested(stop):
                        self.stopped_by = stop.signal_name or "a signal to another rank"
                        break
                    every = self.config.checkpoint.save_every
                    if every and self.step % every == 0 and not final:
                        self.save()
                if self._saved_step != self.step:
                    self.save()
        except KeyboardInterrupt:
            self._close_logger_after_failure()
            raise UserError(
                f"interrupted (Ctrl-C twice) in step {self.step + 1}; its checkpoint was not saved"
            ) from None
        except BaseException:
            self._close_logger_after_failure()
            raise
        else:
            self.logger.close()
        finally:
            self._release()
        return history

    def _close_logger_after_failure(self) -> None:
        """Close the metrics files without masking the failure in flight (disk full fails their close too)."""
        try:
            self.logger.close()
        except Exception as err:
            log.warning("closing the metrics files failed too: %s", err)

    def run_to_end(self, headline: str) -> int:
        """CLI body: train, print a one-line summary on rank 0, release ZeRO-3 state; exit code 0, or
        :data:`~vlm_grpoma.trainer.stop_signals.STOPPED_EXIT_CODE` when a signal stopped it after a save."""
        history = self.train()
        if self.stopped_by is not None:
            if self.dist.is_main:
                print(
                    f"stopped by {self.stopped_by} after step {self.step} of {self.config.train.steps}: "
                    f"checkpoint {self.final_model_dir.parent}; run the same command with "
                    "checkpoint.resume=auto to continue",
                    flush=True,
                )
            self.engine.close()
            # every rank exits together: DeepSpeed's launcher kills the other ranks as soon as one exits non-zero
            barrier("the stop after a signal", self.config.train.dist_timeout_s)
            return STOPPED_EXIT_CODE
        if self.dist.is_main:
            skipped = (
                f" ({self.skipped_steps} skipped: non-finite loss or gradient)" if self.skipped_steps else ""
            )
            last = (
                f"; last {headline} {history[-1][headline]:.3f}, {history[-1]['time/step_s']:.2f} s/step"
                if history
                else " (already done)"
            )
            spikes = self.gss.run_metrics()
            gss = f"; GSS@10 {int(spikes['train/gss10_count'])} steps (max GSS {spikes['train/gss_max']:.2f})"
            print(f"trained {self.step} steps{skipped}{last}{gss}; model in {self.final_model_dir}")
        self.engine.close()
        return 0
