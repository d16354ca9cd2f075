"""The crossover report from hand-written runs: only finished runs count, Δ is paired by seed, its interval and
the slope's are scipy's t-intervals recomputed here by hand, the verdicts follow the rules, and the page and
its figure are written (the prediction table from benchmarks/variance.py included)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from comparison.crossover import mean_interval, predicted_limit, slope_interval, write_crossover
from comparison.graph import Layout, arm_job, build_jobs
from comparison.jobs import MARKER
from comparison.plan import ComparePlan
from scipy import stats

from vlm_grpoma import __version__

#: held-out accuracy when the budget ends: (arm base, flip) -> per seed; T4A4 gains on T16A1 as p grows
ACCURACY = {
    ("T16A1", 0.0): [0.60, 0.62, 0.61, 0.63, 0.59],
    ("T4A4", 0.0): [0.55, 0.58, 0.57, 0.57, 0.56],
    ("T16A1", 0.2): [0.58, 0.57, 0.60, 0.59, 0.58],
    ("T4A4", 0.2): [0.57, 0.58, 0.58, 0.60, 0.57],
    ("T16A1", 0.4): [0.50, 0.52, 0.49, 0.51, 0.50],
    ("T4A4", 0.4): [0.55, 0.56, 0.54, 0.57, 0.55],
}


def write_run(layout, plan, arm, seed, accuracy, finished=True):
    folder = layout.arm(plan.tasks[0], arm, seed)
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/test/answer_match_mean": 0.56}]
    for step in range(1, 4):
        rows.append(
            {
                "step": step,
                "reward/answer_match_mean": 0.5,
                "reward/answer_match/clean_mean": 0.6,
                "reward/noise/flipped_mean": arm.flip,
                "variance/thought_adv_estimate": 0.3 if arm.answers > 1 else None,
            }
        )
    rows.append({"step": 3, "eval/test/answer_match_mean": accuracy})
    (folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    if finished:
        command = arm_job(layout, plan, plan.tasks[0], arm, seed).command()
        (folder / MARKER).write_text(
            json.dumps(
                {
                    "command": command,
                    "version": __version__,
                    "seconds": 150.0,
                    "started_at": 0,
                    "finished_at": 150,
                }
            )
        )


def t_interval(values):
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return statistics.mean(values) - half, statistics.mean(values) + half


def test_the_report_pairs_finished_runs_by_seed_and_judges_by_the_rules(tmp_path):
    plan = ComparePlan.named("crossover")
    layout = Layout(tmp_path / "runs")
    for arm in plan.arms:
        for seed in plan.seeds:
            # one unfinished run (no marker): its metrics must not count
            write_run(
                layout, plan, arm, seed, ACCURACY[(arm.base, arm.flip)][seed], (arm.name, seed) != ("T4A4", 4)
            )
    path = write_crossover(plan, layout, build_jobs(plan, layout), tmp_path / "docs", "results-crossover.md")
    page = path.read_text()
    assert (
        "Runs finished: **29 of 30**" in page
        and (tmp_path / "docs/images/results-crossover.png").stat().st_size
    )

    at_zero = [ACCURACY[("T4A4", 0.0)][s] - ACCURACY[("T16A1", 0.0)][s] for s in range(4)]
    low, high = t_interval(at_zero)
    assert mean_interval(at_zero).low == pytest.approx(low) and high < 0
    assert f"Δ(0) = {statistics.mean(at_zero):+.3f} [{low:+.3f}, {high:+.3f}] (n=4)" in page
    assert "**H1**: holds" in page and "**H2**: holds" in page and "**H3**: holds" in page

    flips = [0.0] * 4 + [0.2] * 5 + [0.4] * 5
    deltas = at_zero + [
        ACCURACY[("T4A4", f)][s] - ACCURACY[("T16A1", f)][s] for f in (0.2, 0.4) for s in range(5)
    ]
    slope = slope_interval(flips, deltas)
    by_hand = statistics.linear_regression(flips, deltas).slope
    assert slope.value == pytest.approx(by_hand) and slope.low > 0
    assert "| 0.2 | 0.584 ± 0.011 | 0.580 ± 0.012 |" in page
    assert "| p | conditional variance T16A1 / T4A4 |" in page and "| 0.4 | " in page


def test_too_few_pairs_leave_every_hypothesis_open_and_the_limit_is_the_formula(tmp_path):
    plan = ComparePlan.named("crossover")
    layout = Layout(tmp_path / "runs")
    for arm in plan.arms[:2]:
        write_run(layout, plan, arm, 0, 0.5)
    page = write_crossover(plan, layout, [], tmp_path / "docs", "results-crossover.md").read_text()
    assert "Runs finished: **2 of 30**" in page and page.count(": too few pairs —") == 3
    assert predicted_limit(0.0, 4, 0.6) == 0 and predicted_limit(0.5, 4, 0.6) == 1
    assert predicted_limit(0.2, 4, 0.5) == pytest.approx(0.16 / (4 * 0.36 * 0.25 + 0.16))
