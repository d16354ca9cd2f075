"""The comparison's numbers and report from hand-written metrics files: statistics checked against the
statistics module, verdicts against hand-computed standard errors, the markdown and the figure on disk."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import numpy as np
import pytest

from vlm_grpoma.compare.graph import Layout, build_jobs
from vlm_grpoma.compare.plan import ComparePlan
from vlm_grpoma.compare.report import write_results
from vlm_grpoma.compare.summary import Stat, difference, read_run, summarise

STEPS = 24


def _write_run(folder, *, reward: np.ndarray, held_out: dict[int, float], thought_variance: float | None,
               spikes: int = 0) -> None:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/test/iou_mean": held_out[0], "eval/test/reward_mean": held_out[0],
             "eval/test/iou/giou_mean": -1.0, "time/eval_s": 2.0}]
    for step in range(1, STEPS + 1):
        row = {"step": step, "reward/total_mean": float(reward[step - 1]), "reward/iou_mean": float(reward[step - 1]),
               "train/grad_norm": 0.5 + step / 100, "train/gss": 1.0, "train/gss10_count": spikes * (step == STEPS),
               "variance/thought_adv_estimate": thought_variance, "time/step_s": 1.5, "time/rollout_s": 0.5,
               "time/reward_s": 0.25, "time/update_s": 0.75}
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
            _write_run(layout.arm(task, arm, seed), reward=reward, held_out=held,
                       thought_variance=0.4 if arm.answers > 1 else None, spikes=seed)
            truth[(arm.name, seed)] = (reward, held)
    return truth


def test_read_run_parses_series_and_held_out_scores(tmp_path):
    reward = np.linspace(0, 1, STEPS)
    _write_run(tmp_path / "run", reward=reward, held_out={0: 0.1, 8: 0.2, STEPS: 0.3}, thought_variance=None, spikes=2)
    run = read_run(tmp_path / "run", "iou")
    assert run.steps == STEPS and np.allclose(run.reward, reward)
    assert run.held_out == {"test": {0: 0.1, 8: 0.2, STEPS: 0.3}}  # eval/test/iou/giou_mean is not the headline
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
    assert summary.held_out_start["test"].mean == pytest.approx(0.10) and summary.held_out_start["test"].std < 1e-12
    assert summary.gss10.mean == pytest.approx(1.0) and summary.thought_variance.mean == pytest.approx(0.4)
    assert summary.train_minutes.mean == pytest.approx((STEPS * 1.5 + 3 * 2.0) / 60)


def test_difference_is_judged_by_two_standard_errors():
    a, b = Stat(1.0, 0.1, 3), Stat(0.5, 0.1, 3)
    d = difference(a, b)
    assert d.se == pytest.approx(math.sqrt(0.01 / 3 + 0.01 / 3)) and d.clear and "(higher)" in d.text()
    assert "(lower)" in difference(b, a).text()
    near = difference(Stat(0.52, 0.1, 3), b)
    assert not near.clear and "within seed noise" in near.text()
    assert "one seed" in difference(Stat(1.0, math.nan, 1), Stat(0.5, math.nan, 1)).text()
    assert difference(Stat.of([]), b).text() == "not measured"
    assert Stat.of([0.1, None, math.nan, 0.3]).n == 2


def test_report_writes_table_verdicts_commands_and_figure(tmp_path):
    plan, layout = _plan(), Layout(tmp_path / "runs")
    _fill(layout, plan)
    jobs = build_jobs(plan, layout)
    path = write_results(plan, layout, jobs, {job.name: 1.0 for job in jobs}, tmp_path / "docs")
    text = path.read_text()
    assert path.name == "results-quick.md" and (tmp_path / "docs" / "images" / "compare_detection.png").stat().st_size > 10_000
    assert "| SFT warm start | — | 0.100 ± 0.000 |" in text
    assert "| T4A4 | 16 | 0.610 ± 0.010 |" in text  # 0.30 + 0.3 lift + 0.01 * seed over seeds 0, 1, 2
    assert "- **T4A4 − T4A1**: held-out iou (test) +0.300 ± 0.008 (higher)" in text
    assert "T4A1 training reward, last 10 − first 10 steps: +0.1" in text
    for job in jobs:
        assert job.command() in text
