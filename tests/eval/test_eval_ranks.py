"""Data-parallel ``eval`` under ``launch/train.sh`` (2 CPU ranks): the ranks share the records batch by batch
and the gathered results are exactly one process's — the same predictions, metrics and summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO), **extra}


@pytest.mark.slow
@pytest.mark.launcher
def test_two_ranks_give_exactly_one_process_results(tmp_path, tiny_model_dir):
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    data = generate_shapes("detection", 5, tmp_path / "shapes", seed=4, split="val", config=EASY)  # 3 batches
    config = tmp_path / "eval.yaml"
    settings = {
        "data": {"eval_path": str(data)},
        "rollout": {"max_thought_tokens": 4, "max_answer_tokens": 8},
        "model": {"dtype": "float32"},
        "logging": {"output_dir": str(tmp_path / "run")},
    }
    config.write_text(yaml.safe_dump(settings))
    args = ["--checkpoint", str(tiny_model_dir("qwen2_vl")), "--overlays", "0", "train.eval_batch_prompts=2"]
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlm_grpoma.cli",
            "eval",
            "--config",
            str(config),
            *args,
            "--out",
            str(tmp_path / "one"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        ["bash", str(REPO / "launch" / "train.sh"), str(config), *args, "--out", str(tmp_path / "two")],
        env=_env(CPU_RANKS="2", COMMAND="eval"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    predictions = (tmp_path / "one" / "val" / "predictions.jsonl").read_text()
    assert (tmp_path / "two" / "val" / "predictions.jsonl").read_text() == predictions
    a = json.loads((tmp_path / "one" / "val" / "metrics.json").read_text())
    b = json.loads((tmp_path / "two" / "val" / "metrics.json").read_text())
    assert b["ranks"] == 2 and a["ranks"] == 1 and b["records"] == 5
    assert b["tasks"] == a["tasks"]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["splits"] == json.loads((tmp_path / "one" / "summary.json").read_text())["splits"]
