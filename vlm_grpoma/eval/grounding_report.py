"""Writing a grounding evaluation: ``metrics.json``, ``report.md``, ``predictions.jsonl`` and PNG overlays."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from vlm_grpoma.answers import ParseError, answer_to_json
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.schema import MaskRef
from vlm_grpoma.eval.grounding_metrics import GROUNDING_TASKS, EvalReport, ScoredPrediction
from vlm_grpoma.eval.overlays import draw_overlay, save_overlay

log = logging.getLogger(__name__)


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
    """Up to ``n`` first-sample predictions, taken round-robin over the grounding tasks in record order (short
    answers have no coordinates to draw)."""
    queues = [
        [p for p in report.predictions if p.prediction.record.task == t and p.prediction.sample == 0]
        for t in report.tasks
        if t in GROUNDING_TASKS
    ]
    chosen: list[ScoredPrediction] = []
    for rank in range(max((len(q) for q in queues), default=0)):
        chosen += [q[rank] for q in queues if rank < len(q)]
    return chosen[: max(0, n)]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:80]


def render_overlay(p: ScoredPrediction):
    """The overlay image of one scored prediction (see :mod:`vlm_grpoma.eval.overlays`)."""
    from vlm_grpoma.datasets.images import load_mask, load_video_frames

    record = p.prediction.record
    mask = load_mask(record) if isinstance(record.ground_truth, MaskRef) else None
    target = f" (on Picture {record.target_image + 1} of {len(record.images)})" if record.images else ""
    caption = f"{record.id} [{record.task}]{target} {record.prompt}\n{p.summary()}"
    answer = None if p.failure else p.prediction.answer
    others = [
        (f"Picture {i + 1}", load_image(path, record.id))
        for i, path in enumerate(record.images)
        if i != record.target_image
    ]
    if record.video is not None:  # the video's first and last frames, before the pictures as in the prompt
        frames = load_video_frames(record)
        others[:0] = [("Video: first frame", frames[0]), (f"Video: frame {len(frames)}", frames[-1])]
    return draw_overlay(
        load_image(record), record.ground_truth, answer, caption, mask, p.failure is not None, others
    )


def _write_text(path: Path, text: str) -> None:
    """Write through a temporary file renamed over ``path``; a lone surrogate a model produced (``\\ud800`` in
    a JSON answer) is written as its ``\\uXXXX`` escape, which JSON reads back as the same string."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    os.replace(tmp, path)


def check_output_folder(path: Path, option: str) -> Path:
    """Create ``path`` and prove it writable before any work, so a read-only, full or file-blocked output is
    one line (StorageError naming ``option``) rather than a traceback after the whole evaluation."""
    from vlm_grpoma.errors import StorageError

    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as err:
        reason = (err.strerror or type(err).__name__).lower()
        raise StorageError(f"{option} {path}: cannot write there: {reason}") from None
    return path


def write_report(
    report: EvalReport, out_dir: Path, overlays: int = 16, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write predictions.jsonl, report.md, metrics.json, then overlays/*.png under ``out_dir``; returns paths.

    The results come first: an overlay that cannot be drawn is a warning, never lost metrics. ``meta``
    (checkpoint, split, ...) is written at the top of metrics.json.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {
        "metrics": out_dir / "metrics.json",
        "report": out_dir / "report.md",
        "predictions": out_dir / "predictions.jsonl",
        "overlays": [],
    }
    lines = [json.dumps(_prediction_json(p), ensure_ascii=False, allow_nan=False) for p in report.predictions]
    _write_text(files["predictions"], "".join(line + "\n" for line in lines))
    _write_text(files["report"], markdown_report(report))
    listed = {k: str(v) for k, v in files.items() if k != "overlays"}
    payload = {**(meta or {}), **report.to_json(), "files": {**listed, "overlays": str(out_dir / "overlays")}}
    _write_text(files["metrics"], json.dumps(payload, indent=2, allow_nan=False) + "\n")
    for i, p in enumerate(overlay_sample(report, overlays)):
        name = f"{i:03d}-{_safe_name(p.prediction.record.id)}.png"
        try:
            files["overlays"].append(save_overlay(render_overlay(p), out_dir / "overlays" / name))
        except Exception as err:  # an optional picture; the metrics above are already on disk
            log.warning(f"overlay of record {p.prediction.record.id} not drawn: {type(err).__name__}: {err}")
    report.files = files
    return files


#: The columns of the summary across splits, per task: the numbers papers report first.
SUMMARY_METRICS: dict[str, tuple[str, ...]] = {
    "detection": ("Acc@0.5", "precision@0.5", "mean_iou", "ap50"),
    "affordance": ("accuracy", "mean_distance_px"),
    "trajectory": ("dfd", "rmse"),
    "answer": ("accuracy",),
}


def summary(reports: dict[str, EvalReport], meta: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``: per split and task the records, format and parse rates and every metric."""
    splits = {
        split: {
            task: {
                "records": t.records,
                "format_rate": t.format_rate,
                "parse_rate": t.parse_rate,
                **t.metrics,
            }
            for task, t in report.tasks.items()
        }
        for split, report in reports.items()
    }
    return {**meta, "splits": splits}


def summary_markdown(payload: dict[str, Any]) -> str:
    """One table per task: a row per split with the summary columns (and pass@k / best-of-k when sampled)."""
    lines = []
    tasks = dict.fromkeys(task for split in payload["splits"].values() for task in split)
    for task in tasks:
        rows = {split: tasks_[task] for split, tasks_ in payload["splits"].items() if task in tasks_}
        extra = [k for k in next(iter(rows.values())) if k.startswith(("pass@", "best_of_"))]
        columns = ["records", "format_rate", *SUMMARY_METRICS.get(task, ()), *extra]
        lines += [f"## {task}", "", "| split | " + " | ".join(columns) + " |"]
        lines.append("|---|" + "---:|" * len(columns))
        for split, row in rows.items():
            cells = [str(row[c]) if c == "records" else _fmt(row.get(c)) for c in columns]
            lines.append(f"| {split} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_summary(payload: dict[str, Any], json_path: Path) -> Path:
    """Write ``summary.json`` and the same tables as ``.md`` beside it."""
    _write_text(json_path, json.dumps(payload, indent=2, allow_nan=False) + "\n")
    _write_text(json_path.with_suffix(".md"), f"# Evaluation summary\n\n{summary_markdown(payload)}")
    return json_path
