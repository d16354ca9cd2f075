"""A miniature comparison through the real commands: tiny model, shapes and SAPIEN data, SFT warm starts,
GRPO and GRPO-MA arms with held-out evaluation, then the report (about a minute on 2 cores)."""

from __future__ import annotations

import json

from comparison.graph import Layout, build_jobs
from comparison.jobs import run_jobs
from comparison.plan import Arm, ComparePlan, TaskSetup
from comparison.report import write_results


def test_miniature_comparison_runs_every_command_and_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = ComparePlan(
        "mini",
        (
            TaskSetup(
                "detection",
                "shapes",
                8,
                {"test": 3},
                sft_steps=2,
                sft_batch=4,
                headline="iou",
                steps=2,
                difficulty="easy",
            ),
            TaskSetup(
                "manipulation",
                "sapien",
                4,
                {"seen": 2, "unseen": 2},
                sft_steps=2,
                sft_batch=4,
                headline="manipulation/success",
                steps=2,
            ),
        ),
        arms=(Arm(2, 1), Arm(2, 2)),
        seeds=(0,),
        eval_every=1,
    )
    layout = Layout(tmp_path / "runs")
    jobs = build_jobs(plan, layout)
    timings = run_jobs(jobs, workers=2, log_dir=layout.logs, report=lambda _: None)
    assert set(timings) == {job.name for job in jobs}
    for task in plan.tasks:
        starts = []
        for arm in plan.arms:
            rows = [
                json.loads(line)
                for line in (layout.arm(task, arm, 0) / "metrics.jsonl").read_text().splitlines()
            ]
            assert [r["step"] for r in rows] == [0, 1, 2]
            for name in task.eval_records:
                assert all(f"eval/{name}/{task.headline}_mean" in r for r in rows)
                assert rows[0][f"eval/{name}/records"] == task.eval_records[name]
            starts.append({k: v for k, v in rows[0].items() if k.startswith("eval/")})
        assert starts[0] == starts[1]  # both arms start from the same warm start: identical step-0 evaluation
    report = write_results(plan, layout, jobs, timings, tmp_path / "docs")
    text = report.read_text()
    assert (
        report.name == "results-mini.md"
        and "| T2A2 | 4 |" in text
        and "held-out manipulation/success (unseen)" in text
    )
    assert (tmp_path / "docs" / "images" / "compare-mini_manipulation.png").is_file()
