"""`vlm-grpoma demo --quick`, both tasks, end to end with the real components (tiny model, SAPIEN renders and
physics, DeepSpeed SFT and GRPO-MA), and the manipulation demo's cache and determinism on a re-run."""

import json
import os
from pathlib import Path

import pytest

from vlm_grpoma.demo.detection import DetectionPlan, run_detection_demo
from vlm_grpoma.demo.manipulation import ManipulationPlan, run_manipulation_demo
from vlm_grpoma.demo.stages import read_metrics

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
PNG = b"\x89PNG\r\n\x1a\n"


def training_numbers(metrics: list[dict]) -> list[dict]:
    """Every logged value except wall-clock times: equal between two runs of the same seed."""
    return [
        {k: v for k, v in m.items() if not k.startswith("time/") and k != "tokens_per_s"} for m in metrics
    ]


def answers(demo) -> list:
    return [[e.answer for r in stage.sets.values() for e in r.episodes] for stage in demo.stages]


@pytest.mark.slow
def test_quick_manipulation_demo_end_to_end_then_rerun_from_cache(tmp_path, capsys):
    plan = ManipulationPlan.quick()
    first = run_manipulation_demo(tmp_path, plan)
    out = capsys.readouterr().out
    assert [s.name for s in first.stages] == ["untrained", "after SFT", "after GRPO-MA"]
    for stage in first.stages:
        assert {n: len(r.episodes) for n, r in stage.sets.items()} == {"seen": 6, "unseen": 6}
    assert first.reused == {"data": None, "warm start": None}
    assert "seen success (6 ep.)" in out and "Newcombe" in out and "cache, data: built by this run" in out

    # The demo's own evaluation is the trainer's: step 0 scores the warm start, the last step the final model.
    metrics = read_metrics(tmp_path / "grpo")
    assert [m["step"] for m in metrics if "eval/seen/records" in m] == [0, 1, 2]
    for stage, logged in ((first.stages[1], metrics[0]), (first.stages[2], metrics[-1])):
        for name, result in stage.sets.items():
            n = len(result.episodes)
            assert logged[f"eval/{name}/records"] == n
            assert logged[f"eval/{name}/manipulation/success_mean"] * n == pytest.approx(
                result.rate.successes
            )
            assert logged[f"eval/{name}/parse_rate"] * n == pytest.approx(result.parsed)
    for name in ("plot", "contacts"):
        assert first.files[name].read_bytes()[:8] == PNG
    summary = json.loads(first.files["summary"].read_text())
    assert summary["stages"]["after GRPO-MA"]["seen"]["episodes"] == 6
    assert set(summary["grpo_ma_minus_sft"]) == {"seen", "unseen"}
    for stage in first.stages:  # every unparsed answer is counted under its reason
        for name, result in stage.sets.items():
            failures = summary["stages"][stage.name][name]["parse_failures"]
            assert sum(failures.values()) == len(result.episodes) - result.parsed

    second = run_manipulation_demo(tmp_path, plan)
    out = capsys.readouterr().out
    assert second.reused["data"] is not None and second.reused["warm start"] is not None
    assert "reused (built earlier in" in out
    assert answers(second) == answers(first)
    assert training_numbers(read_metrics(tmp_path / "grpo")) == training_numbers(metrics)


@pytest.mark.slow
def test_quick_detection_demo_runs_end_to_end(tmp_path, capsys):
    stages = run_detection_demo(tmp_path, DetectionPlan.quick())
    assert [s.name for s in stages] == ["untrained", "after SFT", "after GRPO-MA"]
    assert all(0.0 <= s.iou <= 1.0 and 0.0 <= s.format_rate <= 1.0 for s in stages)
    out = capsys.readouterr().out
    assert "held-out IoU" in out and "GRPO-MA training reward" in out
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == PNG
    assert (tmp_path / "grpo" / "metrics.jsonl").read_text().count("\n") == DetectionPlan.quick().grpo_steps
