"""Numbers of the comparison: each run's metrics.jsonl reduced to per-arm statistics over seeds.

A run's series come from its logged steps; held-out scores from its ``eval/<set>/*`` rows (step 0 is the
shared warm start). Statistics over seeds are mean and sample standard deviation (NaN with one seed);
:func:`difference` compares two arms by the difference of their seed means and its standard error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlm_grpoma.trainer.logging import METRICS_FILE

WINDOW = 10  # steps averaged for "start" and "end" training reward


@dataclass(frozen=True)
class RunSeries:
    """One (task, arm, seed) run: per-step series (index i = step i + 1) and held-out scores by step."""

    steps: int
    reward: np.ndarray
    headline_reward: np.ndarray
    grad_norm: np.ndarray
    gss: np.ndarray
    gss10_count: int
    thought_variance: np.ndarray
    step_seconds: np.ndarray
    phase_seconds: dict[str, float]  # mean seconds per step of rollout, reward, update
    eval_seconds: float
    held_out: dict[str, dict[int, float]]  # set -> step -> mean of the headline component

    @property
    def wall_seconds(self) -> np.ndarray:
        """Cumulative training seconds at the end of each step (evaluation time excluded)."""
        return np.cumsum(self.step_seconds)


def read_run(run_dir: Path, headline: str) -> RunSeries:
    """Parse ``run_dir/metrics.jsonl``; a missing file or key names the run folder."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics; run the comparison first")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["step"] > 0]

    def series(key: str) -> np.ndarray:
        try:
            return np.array([np.nan if r[key] is None else r[key] for r in train], dtype=float)
        except KeyError:
            raise KeyError(f"{path}: no {key!r} in the training rows") from None

    held_out: dict[str, dict[int, float]] = {}
    suffix = f"/{headline}_mean"
    for row in rows:
        for key, value in row.items():
            if key.startswith("eval/") and key.endswith(suffix) and key.count("/") == suffix.count("/") + 1:
                held_out.setdefault(key.split("/")[1], {})[row["step"]] = value
    return RunSeries(
        steps=len(train), reward=series("reward/total_mean"), headline_reward=series(f"reward/{headline}_mean"),
        grad_norm=series("train/grad_norm"), gss=series("train/gss"),
        gss10_count=int(train[-1]["train/gss10_count"]) if train else 0,
        thought_variance=series("variance/thought_adv_estimate"), step_seconds=series("time/step_s"),
        phase_seconds={p: float(np.mean(series(f"time/{p}_s"))) for p in ("rollout", "reward", "update")},
        eval_seconds=float(sum(r.get("time/eval_s") or 0.0 for r in rows)), held_out=held_out)


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over seeds (std NaN with one seed)."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values) -> Stat:
        data = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
        if not len(data):
            return cls(math.nan, math.nan, 0)
        return cls(float(data.mean()), float(data.std(ddof=1)) if len(data) > 1 else math.nan, len(data))

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "—"
        return f"{self.mean:.{digits}f}" + ("" if math.isnan(self.std) else f" ± {self.std:.{digits}f}")


@dataclass(frozen=True)
class ArmSummary:
    """One arm of one task over its seeds."""

    arm: str
    samples: int
    seeds: int
    held_out_start: dict[str, Stat]
    held_out_end: dict[str, Stat]
    reward_start: Stat
    reward_end: Stat
    gss10: Stat
    gss_max: Stat
    grad_norm: Stat
    thought_variance: Stat
    step_seconds: Stat
    phase_seconds: dict[str, Stat]
    train_minutes: Stat


def summarise(arm: str, samples: int, runs: list[RunSeries]) -> ArmSummary:
    sets = sorted({name for run in runs for name in run.held_out})

    def held(name: str, pick) -> Stat:
        return Stat.of(pick(run.held_out[name]) for run in runs if run.held_out.get(name))

    window = lambda run: min(WINDOW, run.steps)  # noqa: E731 - tiny local helper
    return ArmSummary(
        arm=arm, samples=samples, seeds=len(runs),
        held_out_start={n: held(n, lambda by_step: by_step.get(0, math.nan)) for n in sets},
        held_out_end={n: held(n, lambda by_step: by_step[max(by_step)]) for n in sets},
        reward_start=Stat.of(float(np.nanmean(r.reward[:window(r)])) for r in runs),
        reward_end=Stat.of(float(np.nanmean(r.reward[-window(r):])) for r in runs),
        gss10=Stat.of(r.gss10_count for r in runs),
        gss_max=Stat.of(float(np.nanmax(r.gss)) for r in runs),
        grad_norm=Stat.of(float(np.nanmean(r.grad_norm)) for r in runs),
        thought_variance=Stat.of(float(np.nanmean(r.thought_variance)) if np.isfinite(r.thought_variance).any()
                                 else math.nan for r in runs),
        step_seconds=Stat.of(float(np.mean(r.step_seconds)) for r in runs),
        phase_seconds={p: Stat.of(r.phase_seconds[p] for r in runs) for p in ("rollout", "reward", "update")},
        train_minutes=Stat.of((float(r.step_seconds.sum()) + r.eval_seconds) / 60 for r in runs))


@dataclass(frozen=True)
class Difference:
    """``a - b`` of two arms' seed means with its standard error; ``clear`` when |diff| > 2 standard errors."""

    diff: float
    se: float

    @property
    def clear(self) -> bool:
        return math.isfinite(self.se) and self.se > 0 and abs(self.diff) > 2 * self.se

    def text(self) -> str:
        if not math.isfinite(self.diff):
            return "not measured"
        spread = "" if not math.isfinite(self.se) else f" ± {self.se:.3f}"
        if not math.isfinite(self.se):
            verdict = "one seed, no spread to judge by"
        elif self.clear:
            verdict = "higher" if self.diff > 0 else "lower"
        else:
            verdict = "within seed noise"
        return f"{self.diff:+.3f}{spread} ({verdict})"


def difference(a: Stat, b: Stat) -> Difference:
    if a.n == 0 or b.n == 0:
        return Difference(math.nan, math.nan)
    if a.n < 2 or b.n < 2:
        return Difference(a.mean - b.mean, math.nan)
    return Difference(a.mean - b.mean, math.sqrt(a.std ** 2 / a.n + b.std ** 2 / b.n))
