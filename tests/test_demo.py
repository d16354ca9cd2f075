"""`vlm-grpoma demo --quick`: the whole pipeline (tiny model, data, eval, SFT, GRPO-MA, eval, plot) runs."""

import os
from pathlib import Path

import pytest

from vlm_grpoma.demo import DemoPlan, run_demo

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path, capsys):
    stages = run_demo(tmp_path, DemoPlan.quick())
    assert [s.name for s in stages] == ["untrained", "after SFT", "after GRPO-MA"]
    assert all(0.0 <= s.iou <= 1.0 and 0.0 <= s.format_rate <= 1.0 for s in stages)
    out = capsys.readouterr().out
    assert "held-out IoU" in out and "GRPO-MA training reward" in out
    plot = tmp_path / "reward_curve.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "grpo" / "metrics.jsonl").read_text().count("\n") == DemoPlan.quick().grpo_steps
