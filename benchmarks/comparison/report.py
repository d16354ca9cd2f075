"""``docs/results.md`` and its plots from the comparison's runs: tables (mean ± std over seeds), pairwise
differences with their standard errors, one figure per task, the exact commands, and the verdicts in words."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comparison.graph import Layout
from comparison.hypotheses import HYPOTHESES, adaptive_judgement, judge
from comparison.jobs import Job, Timing
from comparison.plan import ComparePlan, TaskSetup
from comparison.summary import (
    ArmSummary,
    RunSeries,
    Stat,
    common_eval_steps,
    difference,
    paired_difference,
    read_run,
    summarise,
)

PAIRS = (("T4A4", "T16A1"), ("T4A4", "T4A1"), ("T8A2", "T16A1"))  # (GRPO-MA arm, GRPO arm)
SMOOTH = 10


def _reading(plan: ComparePlan) -> list[str]:
    """How to read the tables, with this plan's sizes."""
    seeds = len(plan.seeds)
    records = min(n for task in plan.tasks for n in task.eval_records.values())
    budget = (
        f"the same {plan.time_budget_s:g} s of training time (the summed seconds of rollout, reward and update "
        "of their steps; evaluation excluded), so a faster arm takes more steps"
        if plan.equal_time
        else "steps"
    )
    return [
        "## How to read this",
        "",
        f"- Scale: {plan.scale}",
        "- Fairness: all arms of a task start from the same SFT checkpoint and use the same data, learning rate, "
        f"held-out sets and {budget}; they differ only in K, M and the seed (data order and sampling). T16A1, T4A4 "
        "and T8A2 score 16 answers per prompt; T4A1 scores 4. Compare GRPO-MA with T16A1 at equal answers and "
        "with T4A1 at equal thoughts.",
        f"- Noise: held-out scores are greedy decodes of {records}+ records per set (one record moves a score by "
        f"{100 / records:.1f} points on the smallest set), over {seeds} seed{'s' if seeds > 1 else ''} per arm. A "
        "difference is followed by its standard error and called higher/lower only when a two-sided t-test "
        "(Welch's between arms, paired for an arm's own start and end) rejects equality at the 5 % level; "
        "with 3 seeds that needs roughly 3–4 standard errors. About one in twenty comparisons of truly equal "
        "arms is still flagged by chance, and each task makes a dozen.",
        "- Time: jobs run two at a time on the 2 cores (one torch thread each), so the other half of the "
        "machine is busy with a different arm (and, for manipulation, a SAPIEN worker); seconds per step are "
        "indicative to roughly ±20 % between arms and not comparable across machines.",
        "",
    ]


@dataclass(frozen=True)
class TaskResult:
    task: TaskSetup
    runs: dict[str, list[RunSeries]]  # arm name -> one series per seed
    arms: list[ArmSummary]

    def arm(self, name: str) -> ArmSummary | None:
        return next((a for a in self.arms if a.arm == name), None)


def collect(plan: ComparePlan, layout: Layout) -> list[TaskResult]:
    results = []
    for task in plan.tasks:
        runs = {
            arm.name: [read_run(layout.arm(task, arm, seed), task.headline) for seed in plan.seeds]
            for arm in plan.arms
        }
        arms = [summarise(arm.name, arm.samples, runs[arm.name]) for arm in plan.arms]
        results.append(TaskResult(task, runs, arms))
    return results


# ---------------------------------------------------------------------------------------------- plots


def _smooth(values: np.ndarray, window: int = SMOOTH) -> np.ndarray:
    """Trailing moving average (shorter at the start), NaN-aware."""
    out = np.empty_like(values)
    for i in range(len(values)):
        out[i] = np.nanmean(values[max(0, i - window + 1) : i + 1])
    return out


def _band(
    ax, x, runs: list[np.ndarray], label: str, colour, *, smooth: bool = True, style: str = "-"
) -> None:
    stacked = np.vstack([_smooth(r) if smooth else r for r in runs])
    mean = np.nanmean(stacked, axis=0)
    ax.plot(x, mean, style, color=colour, label=label)
    if len(runs) > 1:
        std = np.nanstd(stacked, axis=0, ddof=1)
        ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15, linewidth=0)


def plot_task(result: TaskResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(result.runs, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    (reward_ax, wall_ax, held_ax, held_time_ax), (grad_ax, gss_ax, var_ax, spare_ax) = axes
    spare_ax.axis("off")
    headline = result.task.headline
    for arm, runs in result.runs.items():
        colour = colours[arm]
        shared = min(r.steps for r in runs)  # with a time budget, seeds of an arm take different step counts
        steps = np.arange(1, shared + 1)
        _band(reward_ax, steps, [r.reward[:shared] for r in runs], arm, colour)
        wall = np.mean(np.vstack([r.wall_seconds[:shared] for r in runs]), axis=0)
        _band(wall_ax, wall, [r.reward[:shared] for r in runs], arm, colour)
        for style, name in zip(("-o", "--s"), sorted(runs[0].held_out)):
            at = common_eval_steps(runs, name)
            scores = [np.array([r.held_out[name][s] for s in at]) for r in runs]
            label = f"{arm} {name}"
            _band(held_ax, at, scores, label, colour, smooth=False, style=style)
            seconds = np.mean([[r.seconds_at(s) for s in at] for r in runs], axis=0)
            _band(held_time_ax, seconds, scores, label, colour, smooth=False, style=style)
            last = [
                (r.seconds_at(max(r.held_out[name])), r.held_out[name][max(r.held_out[name])]) for r in runs
            ]
            held_time_ax.scatter(*zip(*last), color=colour, marker="*", s=60, zorder=3)
        _band(grad_ax, steps, [r.grad_norm[:shared] for r in runs], arm, colour)
        gss_ax.plot(
            steps, np.nanmax(np.vstack([r.gss[:shared] for r in runs]), axis=0), color=colour, label=arm, lw=1
        )
        if any(np.isfinite(r.thought_variance).any() for r in runs):
            _band(var_ax, steps, [r.thought_variance[:shared] for r in runs], arm, colour)
    reward_ax.set(
        title=f"training reward ({SMOOTH}-step mean, ±std over seeds)",
        xlabel="step",
        ylabel="mean reward of the K×M answers",
    )
    wall_ax.set(title="training reward vs training time", xlabel="seconds (rollout + reward + update)")
    short = headline.split("/")[-1]
    held_ax.set(title=f"held-out greedy {short}", xlabel="step (0 = the SFT warm start)", ylabel=short)
    held_time_ax.set(
        title=f"held-out greedy {short} vs training time (★ each run's last)",
        xlabel="seconds (rollout + reward + update)",
        ylabel=short,
    )
    grad_ax.set(title="gradient norm before clipping", xlabel="step")
    if all((r.grad_norm > 0).all() for runs in result.runs.values() for r in runs):
        grad_ax.set_yscale("log")  # a step with zero advantage everywhere has a zero gradient
    gss_ax.set(title="gradient spike score (max over seeds)", xlabel="step", ylabel="GSS")
    gss_ax.axhline(10, color="grey", ls=":", lw=1)
    var_ax.set(title="thought-advantage variance estimate (M ≥ 2)", xlabel="step")
    for ax in axes.flat:
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.task.name}: GRPO (T·A1) vs GRPO-MA from one SFT warm start")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- markdown


def _table(result: TaskResult) -> list[str]:
    sets = sorted({name for arm in result.arms for name in arm.held_out_end})
    head = result.task.headline
    columns = [
        "arm",
        "answers/prompt",
        *(f"held-out {head} ({s})" for s in sets),
        "train reward, first 10",
        "train reward, last 10",
        "GSS@10 steps",
        "max GSS",
        "mean grad norm",
        "thought-adv var. est.",
        "steps",
        "s/step",
        "rollout / reward / update s",
        "minutes",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    start = [next(a.held_out_start[s] for a in result.arms if s in a.held_out_start).text() for s in sets]
    lines.append(
        "| SFT warm start | — | " + " | ".join(start) + " |" + " — |" * (len(columns) - 2 - len(sets))
    )
    for a in result.arms:
        phases = " / ".join(f"{a.phase_seconds[p].mean:.2f}" for p in ("rollout", "reward", "update"))
        cells = [
            a.arm,
            str(a.samples),
            *(a.held_out_end[s].text() if s in a.held_out_end else "—" for s in sets),
            a.reward_start.text(),
            a.reward_end.text(),
            a.gss10.text(1),
            a.gss_max.text(2),
            a.grad_norm.text(3),
            a.thought_variance.text(3),
            a.steps.text(0),
            a.step_seconds.text(2),
            phases,
            a.train_minutes.text(1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def equal_step(result: TaskResult) -> int:
    """The last regular evaluation step every run of the task reached (0 when only the warm start is shared)."""
    runs = [run for arm_runs in result.runs.values() for run in arm_runs]
    name = sorted(runs[0].held_out)[0]
    return max(common_eval_steps(runs, name), default=0)


def held_out_at(result: TaskResult, arm: str, name: str, step: int) -> Stat:
    return Stat.of(run.held_out.get(name, {}).get(step) for run in result.runs[arm])


def gss_until(result: TaskResult, arm: str, steps: int) -> Stat:
    """Per run, the largest GSS over its first ``steps`` steps."""
    return Stat.of(float(np.nanmax(run.gss[:steps])) if steps else math.nan for run in result.runs[arm])


def _verdicts(result: TaskResult, equal_time: bool) -> list[str]:
    lines = []
    head = result.task.headline
    shared = equal_step(result)
    for ma, grpo in PAIRS:
        a, b = result.arm(ma), result.arm(grpo)
        if a is None or b is None:
            continue
        sets = sorted(set(a.held_out_end) & set(b.held_out_end))
        when = "at equal time " if equal_time else ""
        parts = [
            f"held-out {head} ({s}) {when}{difference(a.held_out_end[s], b.held_out_end[s]).text()}"
            for s in sets
        ]
        if equal_time:
            parts += [
                f"at equal steps (step {shared}) "
                + difference(held_out_at(result, ma, s, shared), held_out_at(result, grpo, s, shared)).text()
                for s in sets
            ]
        parts.append(f"last-10 training reward {difference(a.reward_end, b.reward_end).text()}")
        parts.append(f"GSS@10 steps {difference(a.gss10, b.gss10).text()}")
        if equal_time:
            steps = shortest(result)
            gss = difference(gss_until(result, ma, steps), gss_until(result, grpo, steps))
            parts.append(f"max GSS over the first {steps} steps {gss.text()}")
        else:
            parts.append(f"max GSS {difference(a.gss_max, b.gss_max).text()}")
        ratio = a.step_seconds.mean / b.step_seconds.mean if b.step_seconds.mean else math.nan
        parts.append(f"time per step ×{ratio:.2f}")
        lines.append(f"- **{ma} − {grpo}**: " + "; ".join(parts) + ".")
    for a in result.arms:
        gain = paired_difference(a.reward_end, a.reward_start)
        lines.append(f"- {a.arm} training reward, last 10 − first 10 steps: {gain.text()}.")
    return lines


def report_names(plan: ComparePlan, page: str | None = None) -> tuple[str, str]:
    """(markdown file, image prefix): ``results.md`` / ``compare_`` for the full plan, suffixed otherwise;
    ``page`` (``--page results-X.md``) names both (``compare-X_`` images)."""
    if page:
        if not page.endswith(".md") or "/" in page:
            raise ValueError(f"--page {page!r}: give a file name ending in .md, e.g. results-adaptive.md")
        return page, "compare-" + page.removesuffix(".md").removeprefix("results-")
    if plan.name == "full":
        return "results.md", "compare"
    return f"results-{plan.name}.md", f"compare-{plan.name}"


def _thought_check(layout: Layout, task: TaskSetup) -> list[str]:
    """The warm start's held-out IoU after the reference, a wrong and its own thought (relational tasks)."""
    path = layout.thought_check(task)
    if not path.is_file():
        return []
    found = json.loads(path.read_text())
    return [
        f"**Does the thought decide?** The SFT warm start's greedy answer on the {found['records']:.0f} held-out "
        "records, decoded after a forced thought (`benchmarks/thought_matters.py`): IoU "
        f"{found['iou_after_reference_thought']:.3f} after the reference thought, "
        f"{found['iou_after_wrong_thought']:.3f} after the same thought concluding on another shape, "
        f"{found['iou_after_own_thought']:.3f} after its own greedy thought.",
        "",
    ]


def shortest(result: TaskResult) -> int:
    """The fewest steps any run of the task took (with a time budget, the slowest arm's)."""
    return min(run.steps for runs in result.runs.values() for run in runs)


def _hypotheses(result: TaskResult, equal_time: bool) -> list[str]:
    """The verdicts the task's arms can decide: H1–H5 at equal time (paper regime, reasoning) with T4A4 and T16A1;
    otherwise H5 alone where T4A4 and its adaptive arm ran (e.g. ``--arms T4A4 T4A4-adaptive``)."""
    arms = {a.arm: a for a in result.arms}
    if equal_time and {"T4A4", "T16A1"} <= set(arms):
        steps = shortest(result)
        gss = {name: gss_until(result, name, steps) for name in ("T4A4", "T16A1")}
        judgements = judge(arms, gss, steps, result.task.headline_label)
    elif {"T4A4", "T4A4-adaptive"} <= set(arms):
        judgements = [adaptive_judgement(arms["T4A4"], arms["T4A4-adaptive"])]
    else:
        return []
    lines = [
        "## Hypotheses",
        "",
        "Stated with the rule that decides each before any of these runs (`benchmarks/comparison/hypotheses.py`), "
        "answered here from the runs above:",
        "",
        "| | hypothesis | decided by | evidence | verdict |",
        "|---|---|---|---|---|",
    ]
    for j in judgements:
        h = j.hypothesis
        lines.append(f"| {h.name} | {h.claim} | {h.rule} | {j.evidence} | **{j.verdict}** |")
    return lines + [""]


def hypotheses_pointer() -> list[str]:
    """The toy report's section on the paper regime: its hypotheses as stated before running."""
    return [
        "## The paper's regime",
        "",
        "These runs are the toy regime (thoughts shorter than answers, equal steps). `python benchmarks/compare.py "
        "--plan paper-regime` runs the regime the paper targets: relational shapes, a ~120-token thought that "
        "decides which shape a ~25-token answer boxes, all arms trained for equal time. Its hypotheses, stated "
        "before it ran and answered in [results-paper-regime.md](results-paper-regime.md):",
        "",
        *(f"- **{h.name}**: {h.claim} *Decided by:* {h.rule}" for h in HYPOTHESES),
        "",
    ]


def write_results(
    plan: ComparePlan,
    layout: Layout,
    jobs: list[Job],
    timings: dict[str, Timing],
    docs: Path,
    page: str | None = None,
) -> Path:
    """Write the markdown report (``page``, default :func:`report_names`) and one figure per task under ``docs``;
    returns the markdown path."""
    markdown, images_prefix = report_names(plan, page)
    results = collect(plan, layout)
    job_minutes = sum(t.seconds for t in timings.values()) / 60
    wall_minutes = (
        max(t.finished_at for t in timings.values()) - min(t.started_at for t in timings.values())
    ) / 60
    budget = (
        f"each arm trains for {plan.time_budget_s:g} s of step time (at most {plan.tasks[0].steps} steps)"
        if plan.equal_time
        else "GRPO runs of equal steps"
    )
    lines = [
        f"# {plan.title}",
        "",
        f"Generated by `python benchmarks/compare.py{plan.arguments}` — "
        "do not edit by hand; rerun it. Every number below comes from the commands listed at the end, run as "
        "separate processes with one torch thread each.",
        "",
        f"- Plan `{plan.name}`: arms {', '.join(a.name for a in plan.arms)}; seeds {list(plan.seeds)}; "
        f"8 prompts per step, {budget}; held-out greedy evaluation every {plan.eval_every} steps"
        + (" and after the last." if plan.equal_time else "."),
        "- Model: tiny Qwen2.5-VL (`make-tiny-model --preset small`, 0.8 M parameters), built offline; one SFT "
        "warm start per task shared by all of its arms.",
        "- Rollout backend: transformers (`rollout.backend: hf`), the faster one on this CPU: vLLM's CPU build "
        "took 1.1–2.3× the time of the transformers backend for the same rollouts (`benchmarks/rollout_vllm.py`, "
        "README § vLLM rollout).",
        f"- Machine: {platform.machine()}, {usable_cores()} cores. Wall time from the first command's start to "
        f"the last one's end: {wall_minutes:.1f} min ({job_minutes:.1f} min of job time, jobs running two at a "
        "time).",
        "- Tables: mean ± sample standard deviation over seeds; verdicts: a difference of means ± its standard "
        "error, judged by a t-test (see below).",
        "",
    ]
    lines += _reading(plan)
    for result in results:
        image = plot_task(result, docs / "images" / f"{images_prefix}_{result.task.name}.png")
        t = result.task
        sets = ", ".join(f"{name} ({n} records)" for name, n in t.eval_records.items())
        steps = (
            f"{plan.time_budget_s:g} s of training per run"
            if plan.equal_time
            else f"{t.steps} GRPO steps per run"
        )
        lines += [
            f"## {t.name}",
            "",
            f"{t.train_records} training records ({t.source}); held-out: {sets}; SFT warm start "
            f"{t.sft_steps} steps of {t.sft_batch}; {steps}. Headline metric: `{t.headline}` of the greedy answer.",
            "",
            *_thought_check(layout, t),
            *_table(result),
            "",
            *_verdicts(result, plan.equal_time),
            "",
            f"![{t.name}](images/{image.name})",
            "",
        ]
        lines += _hypotheses(result, plan.equal_time)
    if not plan.equal_time:
        lines += hypotheses_pointer()
    lines += [
        "## Commands",
        "",
        "Run from the repository root (what `benchmarks/compare.py` ran, in order):",
        "",
        "```",
        *(job.command() for job in jobs),
        "```",
        "",
        "Job times (s): "
        + ", ".join(
            f"{name} {t.seconds:.0f}" for name, t in timings.items() if not name.startswith("train/")
        ),
        "",
    ]
    path = docs / markdown
    path.write_text("\n".join(lines))
    return path


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
