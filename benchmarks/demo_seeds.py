"""The demo's guard: ``vlm-grpoma demo`` for several seeds, a per-seed table, and exit 1 when a seed breaks one of
the demo's claims after GRPO-MA, each judged on the same 64 held-out episodes before and after (the paired 95 %
Newcombe interval the demo prints): seen success rises clearly over SFT (the interval lies above zero), unseen
success does not fall (the interval reaches zero or above: no significant fall; one episode is 1.6 points, so a
point estimate alone cannot tell a fall from noise), and at least 95 % of answers parse on each held-out set.
The check to run after any change to the training path.

    python benchmarks/demo_seeds.py [--seeds 0 1 2] [--out runs/demo-seeds] [--quick] [--rerun]

Each seed runs in its own folder (``<out>/seed-N``, its cache kept); a seed whose ``summary.json`` is there is
read, not rerun (``--rerun`` runs it again), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PARSED_AT_LEAST = 0.95
SETS = ("seen", "unseen")


@dataclass(frozen=True)
class SeedResult:
    seed: int
    summary: dict
    seconds: float | None  # wall time of this invocation's run; None when read from an earlier one

    def stage(self, name: str, held_out: str) -> dict:
        return self.summary["stages"][name][held_out]

    def failures(self) -> list[str]:
        """Which of the three claims this seed breaks, in words."""
        change = self.summary["grpo_ma_minus_sft"]
        found = []
        if change["seen"]["newcombe95"][0] <= 0:
            found.append(f"seen gain {change['seen']['difference']:+.3f} is not clearly above zero")
        if change["unseen"]["newcombe95"][1] < 0:
            found.append(f"unseen success fell {change['unseen']['difference']:+.3f} (interval below zero)")
        for name in SETS:
            after = self.stage("after GRPO-MA", name)
            rate = after["parsed"] / after["episodes"]
            if rate < PARSED_AT_LEAST:
                found.append(f"{name} parse rate {rate:.2f} < {PARSED_AT_LEAST}")
        return found


def run_seed(seed: int, out: Path, quick: bool, rerun: bool) -> SeedResult:
    folder = out / f"seed-{seed}"
    summary = folder / "summary.json"
    if summary.is_file() and not rerun:
        return SeedResult(seed, json.loads(summary.read_text()), None)
    summary.unlink(missing_ok=True)
    command = [sys.executable, "-m", "vlm_grpoma.cli", "demo", "--seed", str(seed), "--out", str(folder)]
    command += ["--quick"] if quick else []
    print(f"[demo-seeds] seed {seed}: {' '.join(command[1:])} (log: {folder}.log)", flush=True)
    started = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{folder}.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if code or not summary.is_file():
        tail = Path(f"{folder}.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise SystemExit(
            f"error: demo --seed {seed} failed (exit {code}): {tail[0] if tail else 'no output'}"
        )
    return SeedResult(seed, json.loads(summary.read_text()), time.perf_counter() - started)


def table(results: list[SeedResult]) -> str:
    """Per seed: seen/unseen success after SFT -> after GRPO-MA with the paired change and its 95 % interval,
    parse rates after GRPO-MA, the demo's minutes and the verdict."""
    lines = [
        "| seed | seen: SFT → GRPO-MA (change) | unseen: SFT → GRPO-MA (change) | parsed after (seen / unseen) "
        "| minutes | holds |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        cells = []
        for name in SETS:
            before, after = result.stage("after SFT", name), result.stage("after GRPO-MA", name)
            change = result.summary["grpo_ma_minus_sft"][name]
            low, high = change["newcombe95"]
            cells.append(
                f"{before['success_rate']:.3f} → {after['success_rate']:.3f} "
                f"({change['difference']:+.3f} [{low:+.3f}, {high:+.3f}])"
            )
        parsed = " / ".join(
            f"{result.stage('after GRPO-MA', n)['parsed'] / result.stage('after GRPO-MA', n)['episodes']:.2f}"
            for n in SETS
        )
        minutes = result.summary["wall_seconds"]["total"] / 60
        failures = result.failures()
        verdict = "yes" if not failures else "**no**: " + "; ".join(failures)
        lines.append(f"| {result.seed} | {cells[0]} | {cells[1]} | {parsed} | {minutes:.1f} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/demo-seeds"))
    parser.add_argument(
        "--quick", action="store_true", help="the demo's smoke-test size (checks the wiring only)"
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run every seed again, even one already summarised"
    )
    args = parser.parse_args(argv)
    results = [run_seed(seed, args.out, args.quick, args.rerun) for seed in args.seeds]
    print(table(results))
    broken = [r.seed for r in results if r.failures()]
    if broken:
        print(
            f"[demo-seeds] the demo's claims fail for seed(s) {', '.join(map(str, broken))}", file=sys.stderr
        )
        return 1
    print(f"[demo-seeds] the demo's claims hold for every seed ({', '.join(map(str, args.seeds))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
