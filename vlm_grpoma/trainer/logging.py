"""Per-step metrics: JSONL always, TensorBoard by default, Weights & Biases when configured, a tqdm bar.

Only rank 0 writes; every rank may call :meth:`MetricsLogger.log` (other ranks ignore it). Metric names are
flat ``group/name`` keys (``reward/total_mean``, ``time/step_s``); :func:`flatten` turns nested dicts into
them and :func:`reduce_metrics` averages (or sums, maxes) them over ranks before logging.

A resumed run redoes the steps after its checkpoint: their rows from the interrupted attempt are dropped from
``metrics.jsonl`` (and purged from TensorBoard), so every step appears once.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from vlm_grpoma.config import LoggingConfig
from vlm_grpoma.errors import StorageError
from vlm_grpoma.run_layout import METRICS_FILE, SAMPLES_FILE, TENSORBOARD_DIR
from vlm_grpoma.trainer.collectives import collective
from vlm_grpoma.trainer.run_dir import atomic_write_text, storage_errors

REWARD_KEY = "reward/total_mean"
STEP_TIME_KEY = "time/step_s"


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"reward": {"total_mean": 1.0}}`` → ``{"reward/total_mean": 1.0}``."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def _scalar(value: Any) -> float | int | str | bool | None:
    """JSON-ready scalar: tensors become numbers, non-finite floats become null (strict JSON)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return float(value)


def keep_rows_until(path: Path, step: int) -> bool:
    """Drop the rows of ``path`` (metrics.jsonl) that a run starting after ``step`` logs again: those after
    ``step``, or all of them when it starts at 0. Returns whether the file existed."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return False
    kept = [line for line in lines if step > 0 and _row_step(line) <= step]
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(kept))
    return True


def _row_step(line: str) -> float:
    """The step of a metrics row (a torn last line from a crash counts as redone)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


class MetricsLogger:
    """Writes one JSON object per step to ``<output_dir>/metrics.jsonl``; a resumed run (``initial_step``) continues
    the file after dropping the rows of the steps it redoes."""

    def __init__(
        self,
        cfg: LoggingConfig,
        *,
        total_steps: int,
        initial_step: int = 0,
        run_config: Mapping[str, Any] | None = None,
        rank: int | None = None,
    ):
        if rank is None:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.cfg = cfg
        self.enabled = rank == 0
        self.output_dir = Path(cfg.output_dir)
        self._jsonl = self._tensorboard = self._wandb = self._bar = None
        if not self.enabled:
            return
        self._path = self.output_dir / METRICS_FILE
        with storage_errors(self._path, "writing metrics"):
            self.output_dir.mkdir(parents=True, exist_ok=True)
            existed = keep_rows_until(self._path, initial_step)
            self._jsonl = open(self._path, "a", encoding="utf-8")  # closed in close()
            if cfg.tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                purge = (initial_step + 1 if initial_step else 0) if existed else None
                self._tensorboard = SummaryWriter(str(self.output_dir / TENSORBOARD_DIR), purge_step=purge)
        if cfg.wandb_project:
            try:
                import wandb
            except ImportError:
                raise ImportError(
                    "logging.wandb_project is set but wandb is not installed: pip install wandb, "
                    "or leave logging.wandb_project empty"
                ) from None
            self._wandb = wandb.init(
                project=cfg.wandb_project,
                name=self.output_dir.resolve().name,
                dir=str(self.output_dir),
                config=dict(run_config or {}),
                resume="allow",
            )
        if cfg.progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, desc="train", unit="step", dynamic_ncols=True
            )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of training step ``step``: JSONL always, TensorBoard/W&B every ``log_every``."""
        if not self.enabled:
            return
        flat = {key: _scalar(value) for key, value in flatten(metrics).items()}
        numeric = {k: v for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with storage_errors(self._path, "writing metrics"):
            self._jsonl.write(json.dumps({"step": step, **flat}) + "\n")
            self._jsonl.flush()
            if step % self.cfg.log_every == 0 and self._tensorboard is not None:
                for key, value in numeric.items():
                    self._tensorboard.add_scalar(key, value, step)
                self._tensorboard.flush()
        if step % self.cfg.log_every == 0 and self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._bar is not None and step > 0:  # step 0 holds only the starting model's evaluation
            postfix = {}
            if numeric.get(REWARD_KEY) is not None:
                postfix["reward"] = f"{numeric[REWARD_KEY]:.3f}"
            if numeric.get(STEP_TIME_KEY) is not None:
                postfix["s/step"] = f"{numeric[STEP_TIME_KEY]:.2f}"
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def log_samples(self, step: int, samples: list[Mapping[str, Any]]) -> None:
        """Every ``logging.samples_every`` steps: sample completions with their rewards, one JSON line each in
        ``samples.jsonl`` and one Markdown table as TensorBoard text (tag ``samples``)."""
        every = self.cfg.samples_every
        if not self.enabled or not every or step % every or not samples:
            return
        flat = [{key: _scalar(value) for key, value in flatten(sample).items()} for sample in samples]
        with open(self.output_dir / SAMPLES_FILE, "a", encoding="utf-8") as f:
            f.writelines(json.dumps({"step": step, **sample}, ensure_ascii=False) + "\n" for sample in flat)
        if self._tensorboard is not None:
            rows = ["| record | thought | answer | reward |", "|---|---|---|---|"]
            for sample in flat:
                cells = [sample.get("record", ""), sample.get("thought", ""), sample.get("answer", "")]
                cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in cells]
                rows.append(f"| {' | '.join(cells)} | {sample.get('reward')} |")
            self._tensorboard.add_text("samples", "\n".join(rows), step)
            self._tensorboard.flush()

    def close(self) -> None:
        """Close every writer; a storage failure of their last flush (disk full) is one StorageError, raised
        once all of them are closed."""
        failure = None
        for closer in (self._bar, self._tensorboard, self._jsonl):
            if closer is not None:
                try:
                    with storage_errors(self.output_dir, "writing metrics"):
                        closer.close()
                except StorageError as err:
                    failure = failure or err
        if self._wandb is not None:
            self._wandb.finish()
        self._jsonl = self._tensorboard = self._wandb = self._bar = None
        if failure is not None:
            raise failure

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reduce_metrics(
    metrics: Mapping[str, float],
    op: Literal["mean", "sum", "max", "min"] = "mean",
    timeout_s: float | None = None,
) -> dict[str, float]:
    """Reduce every value over all ranks (two all-reduces); all ranks must pass the same keys.

    Without a process group (or with one rank) the values come back unchanged. ``timeout_s`` is only named in
    the error when a rank never joins (the process group enforces it).
    """
    keys = sorted(metrics)
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return {k: float(metrics[k]) for k in keys}
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.distributed.get_backend() == "nccl"
        else torch.device("cpu")
    )
    # Same key set on every rank: compare a checksum of the names (max == min over ranks).
    checksum = float(zlib.crc32("\n".join(keys).encode()))
    check = torch.tensor([checksum, -checksum], dtype=torch.float64, device=device)
    with collective("the metrics all-reduce", timeout_s):
        torch.distributed.all_reduce(check, op=torch.distributed.ReduceOp.MAX)
    if check[0].item() != -check[1].item():
        raise ValueError(f"reduce_metrics: ranks passed different metric names (this rank: {keys})")
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    reduce_op = {
        "mean": torch.distributed.ReduceOp.SUM,
        "sum": torch.distributed.ReduceOp.SUM,
        "max": torch.distributed.ReduceOp.MAX,
        "min": torch.distributed.ReduceOp.MIN,
    }[op]
    with collective("the metrics all-reduce", timeout_s):
        torch.distributed.all_reduce(values, op=reduce_op)
    if op == "mean":
        values /= torch.distributed.get_world_size()
    return dict(zip(keys, values.tolist()))


def sum_over_ranks(counts: Mapping[str, float], timeout_s: float | None = None) -> dict[str, float]:
    """Add up per-rank values whose keys may differ between ranks (failure reasons, a rank with no records)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return dict(counts)
    gathered: list[dict[str, float]] = [{} for _ in range(torch.distributed.get_world_size())]
    with collective("the metrics all-gather", timeout_s):
        torch.distributed.all_gather_object(gathered, dict(counts))
    total: dict[str, float] = {}
    for part in gathered:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total
