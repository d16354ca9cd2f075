"""What both demos share: their config files, their tiny model and a clock that announces and times stages."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from vlm_grpoma.run_layout import METRICS_FILE

MODEL_ARCH = "qwen2_5_vl"
MODEL_PRESET = "small"  # 0.8 M parameters: learns the shapes and the SAPIEN contact tasks on CPU


def demo_config(task: str) -> Path:
    """The run config of one demo task, shipped as package data (``vlm_grpoma/configs/demo_<task>.yaml``)."""
    return Path(str(resources.files("vlm_grpoma") / "configs" / f"demo_{task}.yaml"))


def quiet_library_bars() -> None:
    """Hide transformers' per-file bars (loading weights, writing shards) between the demo's stage bars."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-step metrics a trainer wrote to ``<run_dir>/metrics.jsonl`` (step 0: held-out metrics only)."""
    with (run_dir / METRICS_FILE).open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def mean_step_seconds(metrics: list[dict]) -> float:
    steps = [m["time/step_s"] for m in metrics if "time/step_s" in m]
    return sum(steps) / len(steps)


class StageClock:
    """Announces each stage of a demo as it starts ("[demo 2/6] ...") and keeps its wall time."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.seconds: dict[str, float] = {}
        self.notes: dict[str, str] = {}
        self.start = time.perf_counter()
        self.load_at_start = os.getloadavg()

    @contextmanager
    def stage(self, name: str, detail: str) -> Iterator[None]:
        print(f"[demo {len(self.seconds) + 1}/{self.stages}] {name}: {detail}", flush=True)
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - began

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start

    def summary(self) -> str:
        """Wall time per stage and in all, with the machine's load averages (other processes slow a run)."""
        parts = [
            f"{name} {seconds:.0f} s" + (f" ({self.notes[name]})" if name in self.notes else "")
            for name, seconds in self.seconds.items()
        ]
        before = "/".join(f"{x:.2f}" for x in self.load_at_start)
        after = "/".join(f"{x:.2f}" for x in os.getloadavg())
        return (
            f"wall time: {', '.join(parts)}; total {self.total:.0f} s on {os.cpu_count()} cores "
            f"(load average 1/5/15 min: {before} at start, {after} at end)"
        )
