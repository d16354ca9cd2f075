"""Grounding evaluation (CLI ``eval``): run a model over a split, score detection / affordance / trajectory
answers, and write ``metrics.json``, ``report.md``, ``predictions.jsonl`` and PNG overlays.

Metrics (a malformed answer is a failure that scores like an empty or worst answer, never an exception):

- all tasks: ``format_rate`` (``<think>…</think><answer>…</answer>`` and a parseable answer of the task's
  kind, as the ``format`` reward), ``parse_rate`` (a valid typed answer), failure reasons counted.
- detection: ``precision@0.5`` / ``precision@0.75`` — the fraction of ground-truth boxes matched one-to-one
  by a predicted box at IoU >= t (maximum matching, summed over records: Visual-RFT's "matched above
  threshold"); ``success@t`` — over single-box records, the first predicted box has IoU >= t (the REC
  accuracy convention); ``mean_iou`` — the ``iou`` reward's matched score Σ IoU / max(#pred, #gt); COCO
  ``ap`` / ``ap50`` / ``ap75`` (pycocotools COCOeval, when every ground-truth box has a label). The models
  give no confidences, so every predicted box scores 1.0 and is ranked in record order: AP measures unranked
  predictions and is a lower bound of what a detector with a useful confidence ranking would reach.
- affordance: ``accuracy`` — fraction of predicted points inside the target (mask pixel, box, or within the
  affordance reward's inner radius of a target point), averaged over answers; ``mean_distance_px`` — mean
  distance of the predicted points to the target region (0 inside), a failure counting the image diagonal.
- trajectory: ``dfd``, ``hausdorff``, ``rmse`` — discrete Fréchet, Hausdorff and RMSE of both polylines
  normalised by the image size and resampled to 32 points (as the ``trajectory`` reward); a failure counts
  sqrt(2), the normalised image diagonal.

Distances also come as ``*_valid`` means over parsed answers only. With several samples per record (sampled
decoding) every metric is the mean over samples.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from vlm_grpoma.answers import Answer, Boxes, ParseError, Points, Trajectory, answer_to_json, answers_of_kind
from vlm_grpoma.config import RolloutConfig
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, MaskRef, Record
from vlm_grpoma.eval.overlays import draw_overlay, save_overlay
from vlm_grpoma.rewards.affordance import (
    AffordanceReward,
    distance_to_boxes,
    distance_to_points,
    points_in_boxes,
)
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.detection import box_iou, boxes_array, matched_score
from vlm_grpoma.rewards.format import FormatReward
from vlm_grpoma.rewards.trajectory import FAILED_DISTANCE, resample_normalised, trajectory_distances

GROUNDING_TASKS = ("detection", "affordance", "trajectory")
IOU_THRESHOLDS = (0.5, 0.75)
TRAJECTORY_POINTS = 32


# ---------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Prediction:
    """One sampled completion for a record, its answer parsed into ORIGINAL pixels (or why it is not one)."""

    record: Record
    sample: int
    thought_text: str
    answer_text: str
    answer: Answer | ParseError


@dataclass
class ScoredPrediction:
    """A prediction with its per-prediction metrics (a failure scores like an empty or worst answer)."""

    prediction: Prediction
    #: The parse failure reason, None for a valid answer of the record's task kind.
    failure: str | None
    formatted: bool
    #: Per-prediction metric values (e.g. ``iou``, ``matched@0.5``, ``accuracy``, ``dfd``).
    scores: dict[str, float]

    def summary(self) -> str:
        """A short line for overlays: the failure reason or the main scores."""
        if self.failure is not None:
            return f"FAILED: {self.failure}"
        shown = {k: v for k, v in self.scores.items() if not k.startswith(("gt_", "pred_"))}
        return ", ".join(f"{k} {v:.3g}" for k, v in shown.items())


@dataclass
class TaskMetrics:
    """Aggregates over one task's predictions (all samples of all its records)."""

    task: str
    records: int
    predictions: int
    format_rate: float
    parse_rate: float
    failures: dict[str, int]
    #: Aggregate metrics; None where a metric does not apply (e.g. ``success@0.5`` with no single-box record).
    metrics: dict[str, float | None]
    notes: list[str] = field(default_factory=list)


@dataclass
class EvalReport:
    """What :func:`evaluate` returns: metrics per task, every scored prediction, and the files written."""

    tasks: dict[str, TaskMetrics]
    predictions: list[ScoredPrediction]
    samples: int
    greedy: bool
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: Written files (``metrics``, ``report``, ``predictions``, ``overlays``), set by :func:`write_report`.
    files: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        n = len(self.predictions)
        return {
            "records": len({p.prediction.record.id for p in self.predictions}),
            "predictions": n,
            "samples": self.samples,
            "greedy": self.greedy,
            "seconds": round(self.seconds, 3),
            "format_rate": sum(p.formatted for p in self.predictions) / n if n else None,
            "parse_rate": sum(p.failure is None for p in self.predictions) / n if n else None,
            "tasks": {
                name: {k: v for k, v in asdict(t).items() if k != "task"} for name, t in self.tasks.items()
            },
            "notes": self.notes,
        }

    def scalars(self) -> dict[str, float]:
        """Flat ``task/metric`` numbers (rates included, inapplicable metrics left out) for training logs."""
        out = {}
        for name, t in self.tasks.items():
            out[f"{name}/format_rate"], out[f"{name}/parse_rate"] = t.format_rate, t.parse_rate
            out.update({f"{name}/{k}": v for k, v in t.metrics.items() if v is not None})
        return out


# ---------------------------------------------------------------------------------------------- metrics


def max_matches(iou: np.ndarray, threshold: float) -> int:
    """Largest number of one-to-one (pred, gt) pairs with IoU >= threshold in a [#pred, #gt] matrix."""
    if iou.size == 0:
        return 0
    hits = (iou >= threshold).astype(np.float64)
    rows, cols = linear_sum_assignment(hits, maximize=True)
    return int(hits[rows, cols].sum())


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


#: A task scorer: (record, valid answer or None) pairs -> per-pair scores, aggregate metrics, notes.
Scorer = Callable[
    [Sequence[tuple[Record, Answer | None]], Sequence[int]],
    tuple[list[dict[str, float]], dict[str, float | None], list[str]],
]


def _score_detection(pairs, samples):
    """Per answer: matched IoU score, maximum matches at each threshold, single-box success; then AP."""
    for record, _ in pairs:
        if not isinstance(record.ground_truth, Boxes):
            raise ValueError(
                f"record {record.id}: detection evaluation needs box ground truth, got "
                f"{type(record.ground_truth).__name__}"
            )
    scores = []
    for record, answer in pairs:
        gt = boxes_array(record.ground_truth)
        pred = boxes_array(answer) if answer is not None else np.zeros((0, 4))
        iou = box_iou(pred, gt)
        s = {
            "iou": matched_score(iou).score if answer is not None else 0.0,
            "gt_boxes": float(len(gt)),
            "pred_boxes": float(len(pred)),
        }
        for t in IOU_THRESHOLDS:
            s[f"matched@{t}"] = float(max_matches(iou, t))
        if len(gt) == 1:  # single-box record: REC success of the first predicted box
            for t in IOU_THRESHOLDS:
                s[f"success@{t}"] = float(len(pred) > 0 and iou[0, 0] >= t)
        scores.append(s)
    n_gt = sum(s["gt_boxes"] for s in scores)
    single = [s for s in scores if f"success@{IOU_THRESHOLDS[0]}" in s]
    metrics: dict[str, float | None] = {}
    for t in IOU_THRESHOLDS:
        metrics[f"precision@{t}"] = sum(s[f"matched@{t}"] for s in scores) / n_gt if n_gt else None
    for t in IOU_THRESHOLDS:
        metrics[f"success@{t}"] = _mean([s[f"success@{t}"] for s in single])
    metrics["mean_iou"] = _mean([s["iou"] for s in scores])
    metrics["mean_pred_boxes"] = _mean([s["pred_boxes"] for s in scores])
    ap, notes = coco_ap(pairs, samples)
    metrics.update(ap)
    return scores, metrics, notes


def _affordance_distances(
    reward: AffordanceReward, record: Record, points: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(inside [P] bool, distance in pixels [P]) of points to the record's target, as the reward sees it."""
    gt = record.ground_truth
    if isinstance(gt, MaskRef):
        return reward.masks.get(record, gt).lookup(points)
    if isinstance(gt, Boxes):
        boxes = boxes_array(gt)
        return points_in_boxes(points, boxes), distance_to_boxes(points, boxes)
    if isinstance(gt, Points) and gt.points:
        dist = distance_to_points(points, np.asarray(gt.points, dtype=np.float64))
        return dist <= reward.radii(record)[0], dist
    raise ValueError(
        f"record {record.id}: affordance evaluation needs a mask, boxes or >= 1 point as ground "
        f"truth, got {gt!r:.80}"
    )


def _score_affordance(pairs, samples):
    """Per answer: fraction of points on the target and their mean distance to it (pixels)."""
    reward = AffordanceReward()  # its mask cache and radii; one per evaluation, so no stale masks
    scores = []
    for record, answer in pairs:
        diagonal = float(math.hypot(record.width, record.height))
        if answer is None:
            _affordance_distances(reward, record, np.zeros((0, 2)))  # still checks the ground truth
            scores.append({"accuracy": 0.0, "distance_px": diagonal})
            continue
        inside, dist = _affordance_distances(reward, record, np.asarray(answer.points, dtype=np.float64))
        # an empty mask has infinite distance: capped at the diagonal, like a failure
        distance = float(np.minimum(dist, diagonal).mean())
        scores.append({"accuracy": float(inside.mean()), "distance_px": distance})
    valid = [s for s, (_, a) in zip(scores, pairs) if a is not None]
    metrics = {
        "accuracy": _mean([s["accuracy"] for s in scores]),
        "mean_distance_px": _mean([s["distance_px"] for s in scores]),
        "mean_distance_px_valid": _mean([s["distance_px"] for s in valid]),
    }
    return scores, metrics, []


def _score_trajectory(pairs, samples):
    """Per answer: DFD, Hausdorff and RMSE of the normalised, resampled polylines."""
    for record, _ in pairs:
        if not isinstance(record.ground_truth, Trajectory) or len(record.ground_truth.points) < 2:
            raise ValueError(
                f"record {record.id}: trajectory evaluation needs a ground-truth trajectory of "
                f">= 2 points, got {record.ground_truth!r:.80}"
            )
    valid = [i for i, (_, a) in enumerate(pairs) if a is not None]
    sizes = np.array([(pairs[i][0].width, pairs[i][0].height) for i in valid], dtype=np.float64)
    sizes = sizes.reshape(-1, 2)
    preds = resample_normalised([pairs[i][1].points for i in valid], sizes, TRAJECTORY_POINTS)
    gts = resample_normalised([pairs[i][0].ground_truth.points for i in valid], sizes, TRAJECTORY_POINTS)
    dist = trajectory_distances(preds, gts)
    names = {"frechet": "dfd", "hausdorff": "hausdorff", "rmse": "rmse"}
    scores = [{name: FAILED_DISTANCE for name in names.values()} for _ in pairs]
    for j, i in enumerate(valid):
        for metric, name in names.items():
            scores[i][name] = float(dist[metric][j])
    metrics: dict[str, float | None] = {}
    for name in names.values():
        metrics[name] = _mean([s[name] for s in scores])
        metrics[f"{name}_valid"] = _mean([scores[i][name] for i in valid])
    return scores, metrics, []


SCORERS: dict[str, Scorer] = {
    "detection": _score_detection,
    "affordance": _score_affordance,
    "trajectory": _score_trajectory,
}


def coco_ap(
    pairs: Sequence[tuple[Record, Boxes | None]], samples: Sequence[int]
) -> tuple[dict[str, float | None], list[str]]:
    """COCO AP, AP50, AP75 (pycocotools COCOeval, bbox) of the detection pairs, averaged over sample indices.

    Categories are the ground-truth labels. A predicted box counts in the category its label names; an
    unlabelled box takes the record's category when all of the record's boxes share one; other boxes are
    left out. Every box scores 1.0 (see the module docstring). Skipped, with a note, when pycocotools is
    missing or some ground-truth box has no label.
    """
    empty: dict[str, float | None] = {"ap": None, "ap50": None, "ap75": None}
    labels = sorted({b.label for record, _ in pairs for b in record.ground_truth.boxes})
    if not labels:
        return empty, ["COCO AP skipped: no ground-truth boxes"]
    if "" in labels:
        return empty, ["COCO AP skipped: some ground-truth boxes have no label"]
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        return empty, ["COCO AP skipped: pycocotools is not installed (pip install 'vlm-grpoma[dev]')"]
    category = {label: i + 1 for i, label in enumerate(labels)}
    per_sample: list[list[float]] = []
    for s in sorted(set(samples)):
        chosen = [pair for pair, k in zip(pairs, samples) if k == s]
        gt_json: dict[str, list] = {
            "images": [],
            "annotations": [],
            "categories": [{"id": c, "name": n} for n, c in category.items()],
        }
        detections = []
        for image_id, (record, answer) in enumerate(chosen, start=1):
            gt_json["images"].append({"id": image_id, "width": record.width, "height": record.height})
            for b in record.ground_truth.boxes:
                w, h = b.x2 - b.x1, b.y2 - b.y1
                gt_json["annotations"].append(
                    {
                        "id": len(gt_json["annotations"]) + 1,
                        "image_id": image_id,
                        "category_id": category[b.label],
                        "bbox": [b.x1, b.y1, w, h],
                        "area": w * h,
                        "iscrowd": 0,
                    }
                )
            record_labels = {b.label for b in record.ground_truth.boxes}
            for b in answer.boxes if answer is not None else ():
                label = (
                    b.label
                    if b.label in category
                    else (next(iter(record_labels)) if not b.label and len(record_labels) == 1 else None)
                )
                if label is not None:
                    detections.append(
                        {
                            "image_id": image_id,
                            "category_id": category[label],
                            "bbox": [b.x1, b.y1, b.x2 - b.x1, b.y2 - b.y1],
                            "score": 1.0,
                        }
                    )
        if not detections:  # COCO.loadRes rejects an empty list; no detections means AP 0
            per_sample.append([0.0, 0.0, 0.0])
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO()
            gt.dataset = gt_json
            gt.createIndex()
            evaluator = COCOeval(gt, gt.loadRes(detections), iouType="bbox")
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        per_sample.append([max(0.0, float(v)) for v in evaluator.stats[:3]])  # -1 = no ground truth
    ap, ap50, ap75 = np.mean(per_sample, axis=0).tolist()
    return {"ap": ap, "ap50": ap50, "ap75": ap75}, [
        "COCO AP with every predicted box scored 1.0 (no confidences): a lower bound of ranked-prediction AP"
    ]


def _failure(answer: Answer | ParseError, task: str) -> str | None:
    _, _, failures = answers_of_kind([answer], ANSWER_KIND_OF_TASK[task])
    return next(iter(failures), None)


def score_predictions(predictions: Sequence[Prediction], samples: int = 1, greedy: bool = True) -> EvalReport:
    """The metric layer, model-free: score parsed predictions against their records (module docstring)."""
    by_task: dict[str, list[int]] = {}
    for i, p in enumerate(predictions):
        if p.record.task not in SCORERS:
            raise ValueError(
                f"record {p.record.id}: task {p.record.task!r} is not a grounding task "
                f"({', '.join(GROUNDING_TASKS)}); evaluate manipulation with manip-eval"
            )
        by_task.setdefault(p.record.task, []).append(i)
    fmt = (
        FormatReward()
        .score(
            [Completion(p.answer, p.thought_text, p.answer_text) for p in predictions],
            [p.record for p in predictions],
        )
        .total
    )
    failures = [_failure(p.answer, p.record.task) for p in predictions]
    scored: list[ScoredPrediction | None] = [None] * len(predictions)
    tasks = {}
    for task in GROUNDING_TASKS:
        idx = by_task.get(task)
        if not idx:
            continue
        pairs = [(predictions[i].record, None if failures[i] else predictions[i].answer) for i in idx]
        per, metrics, notes = SCORERS[task](pairs, [predictions[i].sample for i in idx])
        for i, s in zip(idx, per):
            scored[i] = ScoredPrediction(predictions[i], failures[i], bool(fmt[i]), s)
        reasons = Counter(failures[i] for i in idx if failures[i])
        tasks[task] = TaskMetrics(
            task=task,
            records=len({predictions[i].record.id for i in idx}),
            predictions=len(idx),
            format_rate=float(np.mean([fmt[i] for i in idx])),
            parse_rate=sum(failures[i] is None for i in idx) / len(idx),
            failures=dict(sorted(reasons.items())),
            metrics=metrics,
            notes=notes,
        )
    return EvalReport(tasks, scored, samples, greedy)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- running


def sampling_params(rollout: RolloutConfig, greedy: bool, samples: int, seed: int):
    """K = ``samples`` independent thought+answer completions per record (M = 1); greedy: K = 1, T = 0."""
    from vlm_grpoma.rollout.engine import SamplingParams

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if greedy and samples != 1:
        raise ValueError(
            f"greedy decoding gives one completion per record; got samples={samples} "
            "(use greedy=False to sample several)"
        )
    return SamplingParams(
        num_thoughts=samples,
        answers_per_thought=1,
        temperature=0.0 if greedy else rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_thought_tokens=rollout.max_thought_tokens,
        max_answer_tokens=rollout.max_answer_tokens,
        seed=seed,
    )


def generate_predictions(
    model: Any, adapter: Any, records: Sequence[Record], params: Any, batch_size: int = 8
) -> list[Prediction]:
    """Sample ``params.num_thoughts`` completions per record with the transformers engine, batch by batch."""
    from vlm_grpoma.rollout.hf import HFRolloutEngine

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    engine = HFRolloutEngine.for_adapter(model, adapter)
    out = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        tree = engine.sample(adapter.build_inputs(chunk), replace(params, seed=params.seed + start))
        completions = tree.completions()  # thought + answer: a real vocabulary can split a tag across them
        for b, record in enumerate(chunk):
            for k in range(params.num_thoughts):
                answer = adapter.parse_answer(completions[b][k][0], record)
                out.append(
                    Prediction(record, k, tree.thought_texts[b][k], tree.answer_texts[b][k][0], answer)
                )
    return out


def evaluate(
    model: Any,
    adapter: Any,
    records: Sequence[Record],
    *,
    greedy: bool = True,
    samples: int = 1,
    batch_size: int = 8,
    seed: int = 0,
    out_dir: str | Path | None = None,
    overlays: int = 16,
    rollout: RolloutConfig | None = None,
) -> EvalReport:
    """Run the model over ``records`` and score it; with ``out_dir`` also write the report files.

    ``rollout`` supplies the token budgets and, for sampled decoding, temperature / top-p / top-k (defaults:
    :class:`RolloutConfig`). The demo calls it in-process after each stage.
    """
    for record in records:
        if record.task not in SCORERS:
            raise ValueError(
                f"record {record.id}: task {record.task!r} is not a grounding task; "
                "evaluate manipulation with manip-eval"
            )
    start = time.perf_counter()
    params = sampling_params(rollout or RolloutConfig(), greedy, samples, seed)
    predictions = generate_predictions(model, adapter, records, params, batch_size)
    report = score_predictions(predictions, samples, greedy)
    report.seconds = time.perf_counter() - start
    if out_dir is not None:
        write_report(report, Path(out_dir), overlays)
    return report


# ---------------------------------------------------------------------------------------------- writing


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


# ---------------------------------------------------------------------------------------------- CLI


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma eval --config X.yaml --checkpoint DIR --split S``; writes <output_dir>/eval-<split>/."""
    import torch

    from vlm_grpoma.datasets.jsonl import RecordError, read_records
    from vlm_grpoma.errors import CommandError
    from vlm_grpoma.models.loading import load_model

    config = args.config_obj
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_dir():
        raise CommandError(f"--checkpoint {checkpoint}: not a folder")
    if not config.data.eval_path:
        raise CommandError("data.eval_path: not set; point it at the JSONL records to evaluate")
    try:
        records = read_records(config.data.eval_path, skip_bad=config.data.skip_bad_records)
    except RecordError as err:
        raise CommandError(str(err)) from None
    in_split = [r for r in records if r.split == args.split]
    if not in_split:
        splits = ", ".join(sorted({r.split for r in records})) or "none"
        raise CommandError(
            f"--split {args.split}: no records in {config.data.eval_path} (splits there: {splits})"
        )
    chosen = [r for r in in_split if r.task in SCORERS]
    notes = []
    if len(chosen) < len(in_split):
        notes.append(f"{len(in_split) - len(chosen)} manipulation record(s) left out: use manip-eval")
    if not chosen:
        raise CommandError(f"--split {args.split}: no grounding records ({', '.join(GROUNDING_TASKS)})")
    samples = int(getattr(args, "samples", 1) or 1)
    out_dir = Path(config.logging.output_dir) / f"eval-{args.split}"
    loaded = load_model(replace(config.model, name_or_path=str(checkpoint)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = loaded.model.to(device).eval()
    print(
        f"evaluating {checkpoint} on {len(chosen)} {args.split} records "
        f"({'greedy' if samples == 1 else f'{samples} samples each'}) on {device}"
    )
    report = evaluate(
        model,
        loaded.adapter,
        chosen,
        greedy=samples == 1,
        samples=samples,
        seed=config.seed,
        rollout=config.rollout,
    )
    report.notes += notes
    meta = {"checkpoint": str(checkpoint), "split": args.split, "eval_path": config.data.eval_path}
    files = write_report(report, out_dir, int(getattr(args, "overlays", 16)), meta)
    print(markdown_report(report), end="")
    print(
        f"metrics: {files['metrics']}\nreport: {files['report']}\npredictions: {files['predictions']}\n"
        f"overlays: {len(files['overlays'])} PNG(s) in {out_dir / 'overlays'}"
    )
    return 0


__all__ = [
    "EvalReport",
    "Prediction",
    "ScoredPrediction",
    "TaskMetrics",
    "coco_ap",
    "evaluate",
    "generate_predictions",
    "main",
    "markdown_report",
    "max_matches",
    "sampling_params",
    "score_predictions",
    "write_report",
]
