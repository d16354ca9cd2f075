"""The comparison's numbers and report from hand-written metrics files: statistics checked against the
statistics module, verdicts against hand-computed standard errors, the markdown and the figure on disk."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics

import numpy as np
import pytest
from comparison.graph import Layout, build_jobs
from comparison.jobs import Timing
from comparison.plan import ComparePlan
from comparison.report import write_results
from comparison.summary import Stat, difference, paired_difference, read_run, summarise

STEPS = 24


def _write_run(
    folder,
    *,
    reward: np.ndarray,
    held_out: dict[int, float],
    thought_variance: float | None,
    spikes: int = 0,
    step_s: float = 1.5,
    gss: float = 1.0,
) -> None:
    folder.mkdir(parents=True)
    rows = [
        {
            "step": 0,
            "eval/test/iou_mean": held_out[0],
            "eval/test/reward_mean": held_out[0],
            "eval/test/iou/giou_mean": -1.0,
            "time/eval_s": 2.0,
        }
    ]
    for step in range(1, len(reward) + 1):
        row = {
            "step": step,
            "reward/total_mean": float(reward[step - 1]),
            "reward/iou_mean": float(reward[step - 1]),
            "train/grad_norm": 0.5 + step / 100,
            "train/gss_running": gss + (step == 3),
            "train/gss10_count": spikes * (step == len(reward)),
            "variance/thought_adv_estimate": thought_variance,
            "time/step_s": step_s,
            "time/rollout_s": 0.5,
            "time/reward_s": 0.25,
            "time/update_s": 0.75,
        }
        if step in held_out:
            row.update({"eval/test/iou_mean": held_out[step], "time/eval_s": 2.0})
        rows.append(row)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _plan() -> ComparePlan:
    quick = ComparePlan.quick().select(tasks=["detection"], arms=["T4A1", "T4A4"])
    return dataclasses.replace(quick, seeds=(0, 1, 2))


def _fill(layout: Layout, plan: ComparePlan) -> dict:
    rng = np.random.default_rng(0)
    task = plan.tasks[0]
    truth = {}
    for arm in plan.arms:
        for seed in plan.seeds:
            lift = 0.3 if arm.answers > 1 else 0.0
            reward = np.linspace(0.2, 0.4 + lift, STEPS) + rng.normal(0, 0.01, STEPS)
            held = {0: 0.10, 8: 0.2, STEPS: 0.30 + lift + 0.01 * seed}
            _write_run(
                layout.arm(task, arm, seed),
                reward=reward,
                held_out=held,
                thought_variance=0.4 if arm.answers > 1 else None,
                spikes=seed,
            )
            truth[(arm.name, seed)] = (reward, held)
    return truth


def test_read_run_parses_series_and_held_out_scores(tmp_path):
    reward = np.linspace(0, 1, STEPS)
    _write_run(
        tmp_path / "run",
        reward=reward,
        held_out={0: 0.1, 8: 0.2, STEPS: 0.3},
        thought_variance=None,
        spikes=2,
    )
    run = read_run(tmp_path / "run", "iou")
    assert run.steps == STEPS and np.allclose(run.reward, reward)
    # eval/test/iou/giou_mean is not the headline
    assert run.held_out == {"test": {0: 0.1, 8: 0.2, STEPS: 0.3}}
    assert run.gss10_count == 2 and run.eval_seconds == pytest.approx(6.0)
    assert np.allclose(run.wall_seconds, 1.5 * np.arange(1, STEPS + 1))
    assert run.phase_seconds == {"rollout": 0.5, "reward": 0.25, "update": 0.75}
    assert np.isnan(run.thought_variance).all()
    with pytest.raises(FileNotFoundError, match=r"nowhere/metrics\.jsonl: no metrics"):
        read_run(tmp_path / "nowhere", "iou")
    with pytest.raises(KeyError, match=r"no 'reward/manipulation/success_mean'"):
        read_run(tmp_path / "run", "manipulation/success")


def test_summary_statistics_match_the_statistics_module(tmp_path):
    plan, layout = _plan(), Layout(tmp_path)
    truth = _fill(layout, plan)
    task, arm = plan.tasks[0], plan.arms[1]
    runs = [read_run(layout.arm(task, arm, s), "iou") for s in plan.seeds]
    summary = summarise(arm.name, arm.samples, runs)
    ends = [float(np.mean(truth[(arm.name, s)][0][-10:])) for s in plan.seeds]
    assert summary.reward_end.mean == pytest.approx(statistics.mean(ends))
    assert summary.reward_end.std == pytest.approx(statistics.stdev(ends))
    held = [truth[(arm.name, s)][1][STEPS] for s in plan.seeds]
    assert summary.held_out_end["test"].mean == pytest.approx(statistics.mean(held))
    assert (
        summary.held_out_start["test"].mean == pytest.approx(0.10)
        and summary.held_out_start["test"].std < 1e-12
    )
    assert summary.gss10.mean == pytest.approx(1.0) and summary.thought_variance.mean == pytest.approx(0.4)
    assert summary.train_minutes.mean == pytest.approx((STEPS * 1.5 + 3 * 2.0) / 60)


def test_verdicts_are_t_tests_at_the_five_percent_level():
    from scipy import stats as scipy_stats

    a, b = Stat.of([1.0, 1.1, 0.9]), Stat.of([0.5, 0.6, 0.4])
    welch = scipy_stats.ttest_ind([1.0, 1.1, 0.9], [0.5, 0.6, 0.4], equal_var=False)
    d = difference(a, b)
    assert d.se == pytest.approx(math.sqrt(0.01 / 3 + 0.01 / 3)) and d.df == pytest.approx(4.0)
    assert d.diff / d.se == pytest.approx(welch.statistic) and d.clear == (welch.pvalue < 0.05)
    assert "(higher)" in d.text() and "(lower)" in difference(b, a).text()
    # 2.2 standard errors: "clear" under a normal approximation, not under the t-test with 4 degrees of freedom
    near = difference(Stat.of([0.5 + 2.2 * d.se, 0.6 + 2.2 * d.se, 0.4 + 2.2 * d.se]), b)
    assert near.diff / near.se == pytest.approx(2.2) and not near.clear and "within seed noise" in near.text()
    assert "one seed" in difference(Stat.of([1.0]), Stat.of([0.5])).text()
    assert difference(Stat.of([]), b).text() == "not measured"
    assert "higher, on every seed" in difference(Stat.of([0.3, 0.3]), Stat.of([0.1, 0.1])).text()
    same = difference(Stat.of([0.0, 0.0]), Stat.of([0.0, 0.0]))
    assert not same.clear and same.text() == "+0.000 ± 0.000 (equal on every seed)"


def test_paired_difference_matches_scipy_and_missing_seeds_are_shown():
    from scipy import stats as scipy_stats

    before, after = [0.20, 0.50, 0.35], [0.26, 0.55, 0.42]
    paired = paired_difference(Stat.of(after), Stat.of(before))
    reference = scipy_stats.ttest_rel(after, before)
    assert paired.diff / paired.se == pytest.approx(reference.statistic) and paired.df == 2
    assert paired.clear == (reference.pvalue < 0.05)
    # unpaired, the seed-to-seed spread would hide the same gain
    assert not difference(Stat.of(after), Stat.of(before)).clear
    partial = Stat.of([0.1, None, math.nan, 0.3])
    assert partial.n == 2 and partial.text() == "0.200 ± 0.141 (n=2)"


def test_report_writes_table_verdicts_commands_and_figure(tmp_path):
    plan, layout = _plan(), Layout(tmp_path / "runs")
    _fill(layout, plan)
    jobs = build_jobs(plan, layout)
    timings = {job.name: Timing(60.0, 1000.0 + 30 * i, 1060.0 + 30 * i) for i, job in enumerate(jobs)}
    path = write_results(plan, layout, jobs, timings, tmp_path / "docs")
    text = path.read_text()
    figure = tmp_path / "docs" / "images" / "compare-quick-subset_detection.png"
    assert path.name == "results-quick-subset.md" and figure.stat().st_size > 10_000
    assert "![detection](images/compare-quick-subset_detection.png)" in text
    assert "| SFT warm start | — | 0.100 ± 0.000 |" in text
    assert "| T4A4 | 16 | 0.610 ± 0.010 |" in text  # 0.30 + 0.3 lift + 0.01 * seed over seeds 0, 1, 2
    assert "- **T4A4 − T4A1**: held-out iou (test) +0.300 ± 0.008 (higher)" in text
    wall = (30 * (len(jobs) - 1) + 60) / 60
    assert f"the last one's end: {wall:.1f} min ({len(jobs):.1f} min of job time" in text
    # the reading notes use this plan's sizes
    assert "32+ records per set" in text and "over 3 seeds per arm" in text
    assert "`python benchmarks/compare.py --quick --tasks detection --arms T4A1 T4A4`" in text
    assert "T4A1 training reward, last 10 − first 10 steps: +0.1" in text
    for job in jobs:
        assert job.command() in text


def test_equal_time_report_reads_scores_against_time_and_steps_and_answers_the_hypotheses(tmp_path):
    plan = dataclasses.replace(ComparePlan.paper_regime_quick(), seeds=(0, 1, 2), time_budget_s=24.0)
    layout = Layout(tmp_path / "runs")
    task = plan.tasks[0]
    speed = {"T4A1": 0.5, "T16A1": 2.0, "T4A4": 1.0, "T8A2": 1.2}  # seconds per step
    variance = {"T4A4": 0.333, "T8A2": 0.5}  # 0.5 at M = 2 predicts 0.5 / (2 - 0.5) = 0.333 at M = 4
    for arm in plan.arms:
        for seed in plan.seeds:
            step_s = speed[arm.name] * (1 + 0.01 * seed)
            steps = int(plan.time_budget_s // step_s) + 1  # the step that crosses the budget ends the run
            lift = 0.2 if arm.name == "T4A4" else 0.0
            held = {s: 0.1 + lift * s / steps + 0.005 * seed for s in range(0, steps, plan.eval_every)}
            held[steps] = 0.1 + lift + 0.005 * seed
            _write_run(
                layout.arm(task, arm, seed),
                reward=np.full(steps, 0.3),
                held_out=held,
                thought_variance=variance.get(arm.name, math.nan) * (1 + 0.003 * (seed - 1)),
                step_s=step_s,
                gss=1.0 if arm.answers > 1 else 3.0 + 0.1 * seed,
            )
    jobs = build_jobs(plan, layout)
    layout.thought_check(task).parent.mkdir(parents=True)
    layout.thought_check(task).write_text(
        json.dumps(
            {
                "records": 16.0,
                "iou_after_reference_thought": 0.8,
                "iou_after_wrong_thought": 0.1,
                "iou_after_own_thought": 0.5,
            }
        )
    )
    timings = {job.name: Timing(60.0, 1000.0 + 30 * i, 1060.0 + 30 * i) for i, job in enumerate(jobs)}
    text = write_results(plan, layout, jobs, timings, tmp_path / "docs").read_text()
    assert text.startswith("# Results in the paper's regime: GRPO-MA vs GRPO at equal time")
    assert "IoU 0.800 after the reference thought, 0.100 after the same thought concluding on another" in text
    assert "each arm trains for 24 s of step time" in text
    # T16A1 (2 s/step) reached step 12 (and 13, where the budget ran out): equal steps are read at step 12
    assert "held-out iou (test) at equal time +0.200 ± 0.004 (higher)" in text
    assert (
        "at equal steps (step 12) +0.099 ± 0.005 (higher)" in text
        and "max GSS over the first 12 steps" in text
    )
    verdicts = dict(re.findall(r"\| (H\d) \|.*\*\*(supported|not supported|inconclusive)\*\* \|", text))
    # H5 needs the T4A4-adaptive arm, which this report did not run
    assert verdicts == {
        "H1": "supported",
        "H2": "supported",
        "H3": "supported",
        "H4": "supported",
        "H5": "inconclusive",
    }
    assert "ratio 0.50 (95 % interval" in text and "predicted for M = 4 from T8A2: 0.333 (inside" in text
    assert (
        tmp_path / "docs" / "images" / "compare-paper-regime-quick_relational.png"
    ).stat().st_size > 10_000


def test_toy_report_states_the_paper_regime_hypotheses(tmp_path):
    plan, layout = _plan(), Layout(tmp_path / "runs")
    _fill(layout, plan)
    jobs = build_jobs(plan, layout)
    timings = {job.name: Timing(60.0, 1000.0, 1060.0) for job in jobs}
    text = write_results(plan, layout, jobs, timings, tmp_path / "docs").read_text()
    assert "## The paper's regime" in text and "[results-paper-regime.md](results-paper-regime.md)" in text
    for name in ("H1", "H2", "H3", "H4"):
        assert f"- **{name}**:" in text


def test_a_t4a4_and_adaptive_subset_answers_h5_alone(tmp_path):
    """``--arms T4A4 T4A4-adaptive`` (no T16A1) still decides H5; the others are not asked."""
    plan = dataclasses.replace(
        ComparePlan.quick().select(tasks=["detection"], arms=["T4A4", "T4A4-adaptive"]), seeds=(0, 1, 2)
    )
    layout = Layout(tmp_path / "runs")
    task = plan.tasks[0]
    variance = {"T4A4": 0.60, "T4A4-adaptive": 0.40}
    for arm in plan.arms:
        for seed in plan.seeds:
            _write_run(
                layout.arm(task, arm, seed),
                reward=np.linspace(0.2, 0.5, STEPS),
                held_out={0: 0.10, STEPS: 0.30 + 0.01 * seed},
                thought_variance=variance[arm.name] + 0.01 * seed,
            )
    jobs = build_jobs(plan, layout)
    timings = {job.name: Timing(60.0, 1000.0 + 30 * i, 1060.0 + 30 * i) for i, job in enumerate(jobs)}
    text = write_results(plan, layout, jobs, timings, tmp_path / "docs").read_text()
    verdicts = dict(re.findall(r"\| (H\d) \|.*\*\*(supported|not supported|inconclusive)\*\* \|", text))
    # variance lower by 0.2 with a seed spread of 0.01 (clear); equal held-out scores are not lower
    assert verdicts == {"H5": "supported"}
    assert "T4A4-adaptive − T4A4 -0.200 ± 0.008" in text
