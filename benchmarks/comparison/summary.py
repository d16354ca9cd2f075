"""Numbers of the comparison: each run's metrics.jsonl reduced to per-arm statistics over seeds.

A run's series come from its logged steps; held-out scores from its ``eval/<set>/*`` rows (step 0 is the
shared warm start). Statistics over seeds are mean and sample standard deviation (NaN with one seed).
:func:`difference` compares two arms (Welch's t-test), :func:`paired_difference` two measurements of the same
seeds (a paired t-test); both call a difference "higher"/"lower" only at the two-sided 5 % level.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from vlm_grpoma.run_layout import METRICS_FILE

WINDOW = (
    10  # steps averaged for "start" and "end" training reward (at most half the run, so they never overlap)
)
LEVEL = 0.05  # two-sided significance level of the verdicts


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

    def seconds_at(self, step: int) -> float:
        """Training seconds spent when ``step`` ended (0 for the warm start)."""
        return float(self.wall_seconds[step - 1]) if step > 0 else 0.0


def common_eval_steps(runs: list[RunSeries], name: str) -> list[int]:
    """Steps at which every run evaluated held-out set ``name`` (with a time budget, each run's last evaluation
    falls where its budget ran out, so only the regular ones are shared)."""
    steps = set.intersection(*(set(run.held_out.get(name, {})) for run in runs)) if runs else set()
    return sorted(steps)


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
        steps=len(train),
        reward=series("reward/total_mean"),
        headline_reward=series(f"reward/{headline}_mean"),
        grad_norm=series("train/grad_norm"),
        gss=series("train/gss_running"),  # online score: comparable at equal steps across run lengths
        gss10_count=int(train[-1]["train/gss10_count"]) if train else 0,
        thought_variance=series("variance/thought_adv_estimate"),
        step_seconds=series("time/step_s"),
        phase_seconds={p: float(np.mean(series(f"time/{p}_s"))) for p in ("rollout", "reward", "update")},
        eval_seconds=float(sum(r.get("time/eval_s") or 0.0 for r in rows)),
        held_out=held_out,
    )


@dataclass(frozen=True)
class Stat:
    """Per-seed values (NaN for a seed without the measurement), their mean and sample standard deviation."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Stat:
        return cls(tuple(math.nan if v is None else float(v) for v in values))

    @property
    def finite(self) -> np.ndarray:
        data = np.array(self.values, dtype=float)
        return data[np.isfinite(data)]

    @property
    def n(self) -> int:
        return len(self.finite)

    @property
    def mean(self) -> float:
        return float(self.finite.mean()) if self.n else math.nan

    @property
    def std(self) -> float:
        return float(self.finite.std(ddof=1)) if self.n > 1 else math.nan

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "—"
        spread = "" if math.isnan(self.std) else f" ± {self.std:.{digits}f}"
        missing = f" (n={self.n})" if self.n < len(self.values) else ""
        return f"{self.mean:.{digits}f}{spread}{missing}"


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
    steps: Stat


def summarise(arm: str, samples: int, runs: list[RunSeries]) -> ArmSummary:
    sets = sorted({name for run in runs for name in run.held_out})

    def held(name: str, pick) -> Stat:
        return Stat.of(pick(run.held_out[name]) for run in runs if run.held_out.get(name))

    window = lambda run: max(1, min(WINDOW, run.steps // 2))  # noqa: E731 - tiny local helper
    return ArmSummary(
        arm=arm,
        samples=samples,
        seeds=len(runs),
        held_out_start={n: held(n, lambda by_step: by_step.get(0, math.nan)) for n in sets},
        held_out_end={n: held(n, lambda by_step: by_step[max(by_step)]) for n in sets},
        reward_start=Stat.of(float(np.nanmean(r.reward[: window(r)])) for r in runs),
        reward_end=Stat.of(float(np.nanmean(r.reward[-window(r) :])) for r in runs),
        gss10=Stat.of(r.gss10_count for r in runs),
        gss_max=Stat.of(float(np.nanmax(r.gss)) for r in runs),
        grad_norm=Stat.of(float(np.nanmean(r.grad_norm)) for r in runs),
        thought_variance=Stat.of(
            float(np.nanmean(r.thought_variance)) if np.isfinite(r.thought_variance).any() else math.nan
            for r in runs
        ),
        step_seconds=Stat.of(float(np.mean(r.step_seconds)) for r in runs),
        phase_seconds={p: Stat.of(r.phase_seconds[p] for r in runs) for p in ("rollout", "reward", "update")},
        train_minutes=Stat.of((float(r.step_seconds.sum()) + r.eval_seconds) / 60 for r in runs),
        steps=Stat.of(r.steps for r in runs),
    )


@dataclass(frozen=True)
class Difference:
    """A difference with its standard error and degrees of freedom; ``clear`` at the two-sided 5 % level."""

    diff: float
    se: float
    df: float

    @property
    def clear(self) -> bool:
        if not (math.isfinite(self.diff) and math.isfinite(self.se)) or self.diff == 0:
            return False
        if self.se == 0:  # every seed gave the same value in each arm, and the arms differ
            return True
        return abs(self.diff) > stats.t.ppf(1 - LEVEL / 2, self.df) * self.se

    def detectable(self, power: float = 0.8) -> float:
        """The smallest true difference this standard error detects at the 5 % level with ``power``:
        (t_{1-α/2} + t_power) · se at Welch's degrees of freedom; NaN without a spread to judge by."""
        if not (math.isfinite(self.se) and math.isfinite(self.df) and self.se > 0):
            return math.nan
        return float((stats.t.ppf(1 - LEVEL / 2, self.df) + stats.t.ppf(power, self.df)) * self.se)

    def text(self) -> str:
        if not math.isfinite(self.diff):
            return "not measured"
        if not math.isfinite(self.se):
            return f"{self.diff:+.3f} (one seed, no spread to judge by)"
        if self.clear:
            verdict = ("higher" if self.diff > 0 else "lower") + (", on every seed" if self.se == 0 else "")
        elif self.se == 0:
            verdict = "equal on every seed"
        else:
            verdict = "within seed noise"
        return f"{self.diff:+.3f} ± {self.se:.3f} ({verdict})"


def difference(a: Stat, b: Stat) -> Difference:
    """``a - b`` of two independent arms: Welch's standard error and Welch–Satterthwaite degrees of freedom."""
    if a.n == 0 or b.n == 0:
        return Difference(math.nan, math.nan, math.nan)
    if a.n < 2 or b.n < 2:
        return Difference(a.mean - b.mean, math.nan, math.nan)
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1)) if se > 0 else math.inf
    return Difference(a.mean - b.mean, se, df)


def paired_difference(after: Stat, before: Stat) -> Difference:
    """``after - before`` measured on the same seeds: mean of the per-seed differences, its standard error."""
    per_seed = Stat.of(x - y for x, y in zip(after.values, before.values))
    if per_seed.n == 0:
        return Difference(math.nan, math.nan, math.nan)
    if per_seed.n < 2:
        return Difference(per_seed.mean, math.nan, math.nan)
    return Difference(per_seed.mean, per_seed.std / math.sqrt(per_seed.n), per_seed.n - 1)
