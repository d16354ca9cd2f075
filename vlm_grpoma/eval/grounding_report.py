"""Writing a grounding evaluation: ``metrics.json``, ``report.md``, ``predictions.jsonl`` and PNG overlays."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from vlm_grpoma.answers import ParseError, answer_to_json
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.schema import MaskRef
from vlm_grpoma.eval.grounding_metrics import EvalReport, ScoredPrediction
from vlm_grpoma.eval.overlays import draw_overlay, save_overlay


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def markdown_report(report: EvalReport, title: str = "Grounding evaluation") -> str:
    """A Markdown table per task (metric | value) plus failure reasons and notes."""
    mode = "greedy" if report.greedy else f"sampled, mean over {report.samples} samples"
    lines = [f"# {title}", "", f"{len(report.predictions)} predictions ({mode}), {report.seconds:.1f} s.", ""]
    for name, t in report.tasks.items():
        lines += [
            f"## {name} ({t.records} records)",
            "",
            "| metric | value |",
            "|---|---:|",
            f"| format rate | {_fmt(t.format_rate)} |",
            f"| parse rate | {_fmt(t.parse_rate)} |",
        ]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in t.metrics.items()]
        lines.append("")
        if t.failures:
            lines += ["| failure reason | count |", "|---|---:|"]
            lines += [f"| {reason} | {count} |" for reason, count in t.failures.items()] + [""]
        lines += [f"- {note}" for note in t.notes] + ([""] if t.notes else [])
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines).rstrip() + "\n"


def _prediction_json(p: ScoredPrediction) -> dict[str, Any]:
    answer = p.prediction.answer
    return {
        "id": p.prediction.record.id,
        "task": p.prediction.record.task,
        "sample": p.prediction.sample,
        "thought": p.prediction.thought_text,
        "answer_text": p.prediction.answer_text,
        "parsed": None if p.failure else answer_to_json(answer),
        "failure": p.failure,
        "failure_detail": answer.detail if isinstance(answer, ParseError) else "",
        "formatted": p.formatted,
        "scores": p.scores,
    }


def overlay_sample(report: EvalReport, n: int) -> list[ScoredPrediction]:
    """Up to ``n`` first-sample predictions, taken round-robin over tasks in record order."""
    queues = [
        [p for p in report.predictions if p.prediction.record.task == t and p.prediction.sample == 0]
        for t in report.tasks
    ]
    chosen: list[ScoredPrediction] = []
    for rank in range(max((len(q) for q in queues), default=0)):
        chosen += [q[rank] for q in queues if rank < len(q)]
    return chosen[: max(0, n)]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:80]


def render_overlay(p: ScoredPrediction):
    """The overlay image of one scored prediction (see :mod:`vlm_grpoma.eval.overlays`)."""
    from vlm_grpoma.datasets.images import load_mask

    record = p.prediction.record
    mask = load_mask(record) if isinstance(record.ground_truth, MaskRef) else None
    caption = f"{record.id} [{record.task}] {record.prompt}\n{p.summary()}"
    answer = None if p.failure else p.prediction.answer
    return draw_overlay(
        load_image(record), record.ground_truth, answer, caption, mask, failed=p.failure is not None
    )


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(
    report: EvalReport, out_dir: Path, overlays: int = 16, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write metrics.json, report.md, predictions.jsonl and overlays/*.png under ``out_dir``; returns paths.

    ``meta`` (checkpoint, split, ...) is written at the top of metrics.json.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {
        "metrics": out_dir / "metrics.json",
        "report": out_dir / "report.md",
        "predictions": out_dir / "predictions.jsonl",
        "overlays": [],
    }
    for i, p in enumerate(overlay_sample(report, overlays)):
        name = f"{i:03d}-{_safe_name(p.prediction.record.id)}.png"
        files["overlays"].append(save_overlay(render_overlay(p), out_dir / "overlays" / name))
    lines = [json.dumps(_prediction_json(p), ensure_ascii=False, allow_nan=False) for p in report.predictions]
    _write_text(files["predictions"], "".join(line + "\n" for line in lines))
    _write_text(files["report"], markdown_report(report))
    listed = {k: [str(v) for v in vs] if isinstance(vs, list) else str(vs) for k, vs in files.items()}
    payload = {**(meta or {}), **report.to_json(), "files": listed}
    _write_text(files["metrics"], json.dumps(payload, indent=2, allow_nan=False) + "\n")
    report.files = files
    return files
