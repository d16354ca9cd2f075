"""``benchmarks/demo_seeds.py``: the per-seed table and the three claims it checks, on summaries shaped as
``vlm-grpoma demo`` writes them (a seed with a summary is read, not rerun)."""

from __future__ import annotations

import json

import demo_seeds
import pytest


def summary(seen: tuple[int, int], unseen: tuple[int, int], seen_low: float, parsed: tuple[int, int]) -> dict:
    """A demo summary over 64 episodes a set: successes after SFT and after GRPO-MA, the seen gain's lower
    Newcombe bound, and how many answers parsed after GRPO-MA (seen, unseen)."""

    def stage(successes: tuple[int, int], parsed: tuple[int, int]) -> dict:
        return {
            name: {"successes": n, "episodes": 64, "success_rate": n / 64, "parsed": p, "parse_failures": {}}
            for name, n, p in zip(("seen", "unseen"), successes, parsed, strict=True)
        }

    return {
        "stages": {
            "after SFT": stage((seen[0], unseen[0]), (64, 64)),
            "after GRPO-MA": stage((seen[1], unseen[1]), parsed),
        },
        "grpo_ma_minus_sft": {
            "seen": {"difference": (seen[1] - seen[0]) / 64, "newcombe95": [seen_low, 0.5]},
            "unseen": {"difference": (d := (unseen[1] - unseen[0]) / 64), "newcombe95": [d - 0.1, d + 0.1]},
        },
        "wall_seconds": {"total": 390.0},
    }


def test_a_seed_that_holds_and_each_way_one_can_fail():
    holds = demo_seeds.SeedResult(0, summary((34, 58), (16, 29), 0.24, (64, 64)), None)
    assert holds.failures() == []
    broken = demo_seeds.SeedResult(1, summary((33, 56), (26, 15), 0.21, (64, 32)), None)
    assert broken.failures() == [
        "unseen success fell -0.172 (interval below zero)",
        "unseen parse rate 0.50 < 0.95",
    ]
    within_noise = demo_seeds.SeedResult(4, summary((32, 50), (14, 12), 0.14, (64, 64)), None)
    assert within_noise.failures() == []  # -0.031, interval [-0.131, +0.069]: no significant fall
    flat = demo_seeds.SeedResult(2, summary((34, 36), (16, 16), -0.05, (61, 64)), None)
    assert flat.failures() == ["seen gain +0.031 is not clearly above zero"]
    assert demo_seeds.SeedResult(3, summary((34, 58), (16, 16), 0.24, (60, 64)), None).failures() == [
        "seen parse rate 0.94 < 0.95"
    ]


@pytest.mark.parametrize(("parsed", "code"), [((64, 64), 0), ((64, 40), 1)])
def test_main_reads_finished_seeds_prints_the_table_and_exits_on_a_broken_claim(
    tmp_path, capsys, parsed, code
):
    for seed in (0, 1):
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(summary((34, 58), (16, 29), 0.24, parsed)))
    assert demo_seeds.main(["--seeds", "0", "1", "--out", str(tmp_path)]) == code
    out = capsys.readouterr()
    rows = [line for line in out.out.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    verdict = "yes" if code == 0 else "**no**: unseen parse rate 0.62 < 0.95"
    assert rows == [
        f"| {s} | 0.531 → 0.906 (+0.375 [+0.240, +0.500]) | 0.250 → 0.453 (+0.203 [+0.103, +0.303]) "
        f"| 1.00 / {parsed[1] / 64:.2f} | 6.5 | {verdict} |"
        for s in (0, 1)
    ]
    assert ("fail for seed(s) 0, 1" in out.err) == bool(code)
