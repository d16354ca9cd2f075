"""``python benchmarks/compare.py [--plan toy|paper-regime|reasoning|crossover] [--quick]``: run every command of the comparison,
then write the report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from comparison.crossover import write_crossover
from comparison.graph import Layout, build_jobs
from comparison.jobs import REPO, JobFailed, run_jobs
from comparison.plan import ComparePlan
from comparison.report import report_names, usable_cores, write_results

ROOT_MARKER = (
    ".compare-root"  # the folder was made by this script: its job folders may be cleared and rebuilt
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/compare.py", description=__doc__)
    p.add_argument(
        "--plan",
        default="toy",
        help="toy (default: short thoughts, equal steps; writes docs/results.md), paper-regime (long "
        "thoughts that decide, equal time; writes docs/results-paper-regime.md), reasoning (text-only "
        "arithmetic, equal time; writes docs/results-reasoning.md) or crossover (T16A1 vs T4A4 as the "
        "answers' rewards get noisier; resumable, writes docs/results-crossover.md from the runs finished so far)",
    )
    p.add_argument(
        "--quick", action="store_true", help="the few-minute version: 1 seed, short runs (a smoke test)"
    )
    p.add_argument("--out", help="folder for data, models and runs (default runs/compare[-<plan>][-quick])")
    p.add_argument(
        "--docs",
        help="where the report and its images/ go (default: the checkout's docs/ for a whole plan, "
        "the --out folder for --quick or a subset)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=usable_cores(),
        help="commands run at once, one torch thread each (default: the cores this process may use)",
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        help="a subset of the plan's tasks (toy: detection, manipulation; paper-regime: relational; "
        "reasoning: arithmetic)",
    )
    p.add_argument("--arms", nargs="+", help="a subset of arms, e.g. T4A1 T4A4")
    p.add_argument("--seeds", nargs="+", type=int, help="a subset of seeds")
    p.add_argument(
        "--steps", type=int, help="GRPO steps of every run (default: the plan's), the same for every arm"
    )
    p.add_argument(
        "--sft-steps",
        type=int,
        help="steps of every task's SFT warm start (default: the plan's); every arm still starts from the same one",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        help="seconds of step time every arm trains (equal-time plans; default: the plan's), the same for every arm",
    )
    p.add_argument(
        "--page",
        help="file name of the report under --docs (default results.md for the whole toy plan, "
        "results-<plan>.md otherwise), e.g. results-adaptive.md so a subset does not overwrite a whole plan's",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from finished runs (crossover: from those finished so far)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = (
            ComparePlan.named(args.plan, args.quick)
            .select(args.tasks, args.arms, args.seeds)
            .with_steps(args.steps)
            .with_sft_steps(args.sft_steps)
            .with_time_budget(args.time_budget)
            .with_page(args.page)
        )
        report_names(plan, args.page)  # a bad --page fails now, not after the runs
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("error: --workers must be >= 1", file=sys.stderr)
        return 2
    default_out = "runs/compare" + ("" if args.plan == "toy" else f"-{args.plan}")
    default_out += "-quick" if args.quick else ""
    layout = Layout(Path(args.out or default_out).resolve())
    root = layout.root
    if root.exists() and any(root.iterdir()) and not (root / ROOT_MARKER).exists():
        print(
            f"error: --out {root} holds files this script did not make; it clears and rebuilds job folders "
            "there, so choose a new or empty folder",
            file=sys.stderr,
        )
        return 1
    root.mkdir(parents=True, exist_ok=True)
    (root / ROOT_MARKER).touch()
    jobs = build_jobs(plan, layout)
    start = time.perf_counter()
    crossover = plan.name.startswith("crossover")
    if args.report_only and crossover:
        timings = {}
    elif args.report_only:
        timings = {job.name: job.finished() for job in jobs}
        missing = [name for name, timing in timings.items() if timing is None]
        if missing:
            print(
                f"error: --report-only needs finished runs; not finished: {', '.join(missing[:5])}",
                file=sys.stderr,
            )
            return 1
    else:
        print(
            f"[compare] plan {plan.name}: {len(jobs)} commands, {args.workers} at a time, under {layout.root}"
        )
        try:
            timings = run_jobs(jobs, workers=args.workers, log_dir=layout.logs)
        except JobFailed as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    whole = plan.name in ("full", "paper-regime", "reasoning", "crossover")
    docs = Path(args.docs) if args.docs else REPO / "docs" if whole else layout.root
    if crossover:
        path = write_crossover(plan, layout, jobs, docs, report_names(plan, args.page)[0])
    else:
        path = write_results(plan, layout, jobs, timings, docs, args.page)
    print(f"[compare] wrote {path} in {(time.perf_counter() - start) / 60:.1f} min")
    return 0
