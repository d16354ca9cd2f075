"""The crossover plan's hypotheses (issue #52), written before any of its runs, and their rules.

The predictions come from ``benchmarks/variance.py --crossover`` (section 4: the answer copies its thought's
result, each answer's reward flipped with probability p; thoughts right with probability 0.55, the warm start's
held-out accuracy in the reasoning plan). Three readings of "the thought advantage gets better with M":

- *conditional variance* (the paper's, answer noise with the thoughts fixed): T4A4's is below T16A1's at every
  p > 0 (p = 0.2: 0.263 vs 0.605; p = 0.4: 0.638 vs 0.900); both are 0 at p = 0;
- *per-thought signal-to-noise* S²/N (S: how far the advantage separates right from wrong thoughts, N: its
  variance given rightness, over thoughts and answers both): T4A4's reaches T16A1's at p* = 0.09 (0.13 at
  accuracy 0.75);
- *per-prompt signal-to-noise* K·S²/N (K independent thoughts push one gradient): T16A1 ahead at every p <= 0.45,
  the gap closing (T4A4 / T16A1 = 0.05 at p = 0, 0.49 at 0.2, 0.72 at 0.4): no crossover.

Measured: the held-out accuracy (greedy, clean rewards) of every run when its 150 s of training end, and
Δ(p) = T4A4 − T16A1 paired by seed (same data order).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from comparison.graph import Layout, arm_job
from comparison.jobs import Job
from comparison.plan import CROSSOVER_ARMS, REASONING_SCALE, Arm, ComparePlan
from comparison.summary import Stat
from vlm_grpoma.run_layout import METRICS_FILE

HELD_OUT = "eval/test/answer_match_mean"
VARIANCE = "variance/thought_adv_estimate"
PREDICTION_ACCURACY = 0.55

#: written 2026-12-07, before any crossover run (git history: this file's first commit precedes the results)
HYPOTHESES = (
    (
        "H1",
        "Without noise (p = 0) M > 1 costs: Δ(0) < 0.",
        "The reasoning plan's T4A4 − T16A1 at equal time was −0.029 ± 0.016; every reading above ranks T16A1 "
        "first at p = 0.",
    ),
    (
        "H2",
        "Noise helps T4A4 relatively: the slope of Δ over p is > 0.",
        "All three readings move toward T4A4 as p grows.",
    ),
    (
        "H3",
        "A crossover within the grid: Δ(0.4) > 0.",
        "Predicted by the conditional variance and the per-thought S²/N (p* ≈ 0.09), not by the per-prompt S²/N "
        "(no crossover): the verdict says which reading predicts training.",
    ),
)
#: how each hypothesis is judged, fixed with them
RULES = (
    "Δ at one p: the mean over seeds of the paired per-seed differences, with a 95 % t-interval; 'greater "
    "than 0' when the interval lies above 0, 'less than 0' when below, otherwise inconclusive.",
    "The slope: least squares of the per-seed Δ on p over all finished pairs, with a 95 % t-interval "
    "(n − 2 degrees of freedom); 'positive' when the interval lies above 0.",
    "H1 holds when Δ(0) is less than 0, H2 when the slope is positive, H3 when Δ(0.4) is greater than 0; each "
    "is refuted when its interval lies on the other side, and inconclusive otherwise (or with fewer than 3 "
    "pairs).",
)


@dataclass(frozen=True)
class CrossoverRun:
    """One finished run: its arm and seed, held-out accuracy at the warm start and when its budget ended, the
    steps it made, and the means over its steps of the logged variance estimate (NaN for M = 1), the share of
    flipped scores and the clean training accuracy."""

    arm: Arm
    seed: int
    start: float
    accuracy: float
    steps: int
    variance_estimate: float
    flipped: float
    clean_accuracy: float


def read_crossover_run(arm: Arm, seed: int, folder: Path) -> CrossoverRun:
    rows = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines() if line.strip()]
    held = {r["step"]: r[HELD_OUT] for r in rows if HELD_OUT in r}
    train = [r for r in rows if r["step"] > 0]
    clean = "reward/answer_match/clean_mean" if arm.flip else "reward/answer_match_mean"

    def mean(key: str) -> float:
        values = [r[key] for r in train if r.get(key) is not None]
        return float(np.mean(values)) if values else math.nan

    return CrossoverRun(
        arm,
        seed,
        held[0],
        held[max(held)],
        len(train),
        mean(VARIANCE),
        mean("reward/noise/flipped_mean"),
        mean(clean),
    )


def finished_runs(plan: ComparePlan, layout: Layout) -> list[CrossoverRun]:
    """Every run of ``plan`` whose job finished (its marker matches), in plan order; the others are left out."""
    return [
        read_crossover_run(arm, seed, layout.arm(task, arm, seed))
        for task in plan.tasks
        for arm in plan.arms
        for seed in plan.seeds
        if arm_job(layout, plan, task, arm, seed).finished() is not None
    ]


@dataclass(frozen=True)
class Interval:
    """A mean (or slope) with its 95 % t-interval over ``n`` values."""

    value: float
    low: float
    high: float
    n: int

    @property
    def sign(self) -> str:
        if self.n < 3:
            return "too few pairs"
        return "greater than 0" if self.low > 0 else "less than 0" if self.high < 0 else "inconclusive"

    def text(self) -> str:
        if self.n < 2:
            return "—" if self.n == 0 else f"{self.value:+.3f} (1 pair)"
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n={self.n})"


def mean_interval(values: Sequence[float]) -> Interval:
    data = np.asarray(values, dtype=float)
    if len(data) < 2:
        return Interval(float(data.mean()) if len(data) else math.nan, -math.inf, math.inf, len(data))
    half = stats.t.ppf(0.975, len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data))
    return Interval(float(data.mean()), float(data.mean() - half), float(data.mean() + half), len(data))


def slope_interval(flips: Sequence[float], deltas: Sequence[float]) -> Interval:
    if len(set(flips)) < 2 or len(deltas) < 3:
        return Interval(math.nan, -math.inf, math.inf, len(deltas))
    fit = stats.linregress(flips, deltas)
    half = stats.t.ppf(0.975, len(deltas) - 2) * fit.stderr
    return Interval(float(fit.slope), float(fit.slope - half), float(fit.slope + half), len(deltas))


def paired_deltas(runs: Sequence[CrossoverRun], flip: float) -> list[float]:
    """T4A4 − T16A1 held-out accuracy at ``flip``, one per seed both finished."""
    by = {(run.arm.base, run.arm.flip, run.seed): run.accuracy for run in runs}
    seeds = sorted({run.seed for run in runs})
    return [
        by[("T4A4", flip, s)] - by[("T16A1", flip, s)]
        for s in seeds
        if ("T4A4", flip, s) in by and ("T16A1", flip, s) in by
    ]


def predicted_limit(flip: float, answers: int, accuracy: float) -> float:
    """The large-K conditional variance σ²/(M·τ² + σ̄²) of the flipped copy-the-thought model (what the logged
    ``variance/thought_adv_estimate`` targets), thoughts right with probability ``accuracy``."""
    noise = flip * (1 - flip)
    spread = (1 - 2 * flip) ** 2 * accuracy * (1 - accuracy)
    return noise / (answers * spread + noise) if noise + spread > 0 else math.nan


def verdicts(runs: Sequence[CrossoverRun], flips: Sequence[float]) -> dict[str, tuple[str, str]]:
    """Hypothesis -> (verdict, the interval it rests on), by :data:`RULES`."""
    low, high = min(flips), max(flips)
    at_low, at_high = mean_interval(paired_deltas(runs, low)), mean_interval(paired_deltas(runs, high))
    pairs = [(flip, delta) for flip in flips for delta in paired_deltas(runs, flip)]
    slope = slope_interval([f for f, _ in pairs], [d for _, d in pairs])

    def verdict(interval: Interval, wanted: str) -> str:
        sign = interval.sign
        if sign in ("inconclusive", "too few pairs"):
            return sign
        return "holds" if sign == wanted else "refuted"

    return {
        "H1": (verdict(at_low, "less than 0"), f"Δ({low:g}) = {at_low.text()}"),
        "H2": (verdict(slope, "greater than 0"), f"slope = {slope.text()} per unit of p"),
        "H3": (verdict(at_high, "greater than 0"), f"Δ({high:g}) = {at_high.text()}"),
    }


def _predictions(flips: Sequence[float]) -> list[str]:
    """The prediction table of benchmarks/variance.py --crossover at the plan's flips (accuracy 0.55)."""
    from variance import crossover_curve

    points = crossover_curve(PREDICTION_ACCURACY, 1024, 32, torch.Generator().manual_seed(0), flips)
    by = {(p.flip, p.thoughts): p for p in points}
    lines = [
        "| p | conditional variance T16A1 / T4A4 | S²/N per thought T16A1 / T4A4 | K·S²/N per prompt T16A1 / T4A4 |",
        "|---|---|---|---|",
    ]
    for flip in flips:
        a, b = by[(flip, 16)], by[(flip, 4)]
        lines.append(
            f"| {flip:g} | {a.conditional:.3f} / {b.conditional:.3f} | {a.per_thought:.2f} / {b.per_thought:.2f} "
            f"| {a.per_prompt:.1f} / {b.per_prompt:.1f} |"
        )
    return lines


def plot_crossover(runs: Sequence[CrossoverRun], flips: Sequence[float], path: Path) -> Path:
    """Held-out accuracy of each arm against p (seeds as dots, means as lines) and Δ with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for base, colour in (("T16A1", "tab:blue"), ("T4A4", "tab:orange")):
        chosen = [r for r in runs if r.arm.base == base]
        left.scatter(
            [r.arm.flip for r in chosen], [r.accuracy for r in chosen], color=colour, alpha=0.4, s=14
        )
        at = {f: [r.accuracy for r in chosen if r.arm.flip == f] for f in flips}
        means = [(f, float(np.mean(values))) for f, values in at.items() if values]
        left.plot([f for f, _ in means], [m for _, m in means], "o-", color=colour, label=base)
    left.set(xlabel="p (answer rewards flipped)", ylabel="held-out accuracy (clean)", title="Arms")
    left.legend()
    intervals = [(f, mean_interval(paired_deltas(runs, f))) for f in flips]
    intervals = [(f, i) for f, i in intervals if i.n >= 2]
    right.axhline(0, color="grey", lw=0.8)
    right.errorbar(
        [f for f, _ in intervals],
        [i.value for _, i in intervals],
        yerr=[[i.value - i.low for _, i in intervals], [i.high - i.value for _, i in intervals]],
        fmt="o-",
        capsize=4,
    )
    right.set(xlabel="p", ylabel="T4A4 − T16A1", title="Δ, 95 % t-interval over seeds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_crossover(plan: ComparePlan, layout: Layout, jobs: Sequence[Job], docs: Path, page: str) -> Path:
    """``docs/<page>`` (and its figure) from whatever runs of ``plan`` have finished."""
    runs = finished_runs(plan, layout)
    flips = sorted({arm.flip for arm in plan.arms})
    planned = len(plan.arms) * len(plan.seeds)
    image = plot_crossover(runs, flips, docs / "images" / page.replace(".md", ".png"))
    results = verdicts(runs, flips)
    lines = [
        f"# {plan.title}",
        "",
        f"Generated by `python benchmarks/compare.py{plan.arguments}` from the runs finished so far — do not edit "
        "by hand; rerun it (finished runs are kept, the rest run, the page is rewritten).",
        "",
        f"- Runs finished: **{len(runs)} of {planned}** ({len(plan.seeds)} seeds × arms "
        f"{', '.join(a.name for a in plan.arms)}); {plan.time_budget_s:g} s of step time each, 8 prompts a "
        "step, 16 answers a prompt in both arms; held-out accuracy of the greedy answer with clean rewards when "
        "the budget ends.",
        f"- Task: {REASONING_SCALE}",
        "- Noise: `rewards.noise.flip=p` flips each training answer's `answer_match` score with probability p "
        "(an experimental control; the format reward and held-out scoring are untouched).",
        "",
        "## Hypotheses (written 2026-12-07, before any run; see git history of "
        "benchmarks/comparison/crossover.py)",
        "",
        *(f"- **{name}** {claim} *Why:* {why}" for name, claim, why in HYPOTHESES),
        "",
        "Rules:",
        "",
        *(f"- {rule}" for rule in RULES),
        "",
        "Predictions (`benchmarks/variance.py --crossover`, thoughts right with probability "
        f"{PREDICTION_ACCURACY:g}):",
        "",
        *_predictions(flips),
        "",
        "## Verdicts",
        "",
        *(f"- **{name}**: {verdict} — {basis}" for name, (verdict, basis) in results.items()),
        "",
        "## Results",
        "",
        "| p | T16A1 held-out | T4A4 held-out | Δ = T4A4 − T16A1 (paired) | steps T16A1 / T4A4 | flipped | "
        "T4A4 variance estimate / predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    for flip in flips:
        arm_runs = {
            base: [r for r in runs if r.arm.base == base and r.arm.flip == flip] for base in CROSSOVER_ARMS
        }
        t16, t4 = (Stat.of([r.accuracy for r in arm_runs[base]]) for base in CROSSOVER_ARMS)
        steps = " / ".join(
            f"{np.mean([r.steps for r in arm_runs[b]]):.0f}" if arm_runs[b] else "—" for b in CROSSOVER_ARMS
        )
        every = arm_runs["T16A1"] + arm_runs["T4A4"]
        flipped = f"{np.mean([r.flipped for r in every]):.3f}" if flip and every else "—"
        estimate = Stat.of([r.variance_estimate for r in arm_runs["T4A4"]])
        predicted = Stat.of([predicted_limit(flip, 4, r.clean_accuracy) for r in arm_runs["T4A4"]])
        lines.append(
            f"| {flip:g} | {t16.text()} | {t4.text()} | {mean_interval(paired_deltas(runs, flip)).text()} | "
            f"{steps} | {flipped} | {estimate.text()} / {predicted.text()} |"
        )
    starts = Stat.of([r.start for r in runs])
    timings = [timing for job in jobs if (timing := job.finished()) is not None]
    if timings:
        wall = (max(t.finished_at for t in timings) - min(t.started_at for t in timings)) / 60
        lines += [
            "",
            f"Wall time from the first command's start to the last one's end: {wall:.1f} min "
            f"({sum(t.seconds for t in timings) / 60:.1f} min of job time, two jobs at a time on 2 cores).",
        ]
    lines += [
        "",
        f"Warm start held-out accuracy (step 0, every run): {starts.text()}. Held-out: mean ± standard "
        "deviation over seeds. The variance estimate is the mean over steps of `variance/thought_adv_estimate` "
        "(the plug-in estimate of σ²/(M·τ² + σ̄²)); predicted: that limit of the flipped model at each run's "
        "clean training accuracy. At K = 4 the plug-in estimate's expectation lies above the limit (docs/algorithm.md, "
        "'Why M matters'), and at p = 0 the answers do not copy their thought exactly, so the model's 0 is a floor. "
        "Steps: T4A4 shares each thought's prefix among its 4 answers, so it takes about twice the steps of T16A1 "
        "in the same time; the predictions are per step.",
        "",
        f"![crossover](images/{image.name})",
        "",
        "Every finished run: " + ", ".join(f"{r.arm.name}/seed{r.seed} {r.accuracy:.3f}" for r in runs) + ".",
        "",
        "## Commands",
        "",
        "```",
        *(job.command() for job in jobs),
        "```",
        "",
    ]
    path = docs / page
    path.write_text("\n".join(lines))
    return path
