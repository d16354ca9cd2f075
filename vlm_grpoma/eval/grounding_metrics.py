"""Evaluation metrics: score detection / affordance / trajectory / short-answer predictions against their records.

Metrics (a malformed answer is a failure that scores like an empty or worst answer, never an exception):

- all tasks: ``format_rate`` (``<think>…</think><answer>…</answer>`` and a parseable answer of the task's
  kind, as the ``format`` reward), ``parse_rate`` (a valid typed answer), failure reasons counted.
- detection: ``precision@0.5`` / ``precision@0.75`` — the fraction of ground-truth boxes matched one-to-one
  by a predicted box at IoU >= t (maximum matching, summed over records; ours: Visual-RFT and VLM-R1 match
  greedily, see :mod:`~vlm_grpoma.rewards.detection`); ``Acc@t`` — over single-box records, the first
  predicted box has IoU >= t (RefCOCO's REC accuracy, Acc@0.5 in the papers); ``mean_iou`` — the ``iou``
  reward's default (``hungarian``) matched score Σ IoU / max(#pred, #gt); COCO ``ap`` / ``ap50`` / ``ap75``
  (pycocotools COCOeval, when every ground-truth box has a label). The models
  give no confidences, so every predicted box scores 1.0 and is ranked in record order: AP measures unranked
  predictions and is a lower bound of what a detector with a useful confidence ranking would reach.
- affordance: ``accuracy`` — fraction of predicted points inside the target (mask pixel, box, or within the
  affordance reward's inner radius of a target point), averaged over answers; ``mean_distance_px`` — mean
  distance of the predicted points to the target region (0 inside), a failure counting the image diagonal.
- trajectory: ``dfd``, ``hausdorff``, ``rmse`` — discrete Fréchet, Hausdorff and RMSE of both polylines
  normalised by the image size, on their vertices (the ``trajectory`` reward's default ``evaluation``, as
  RoboBrain / ShareRobot report them; RMSE after interpolating both by vertex index to the longer's count);
  ``dfd_resampled``, ``hausdorff_resampled``, ``rmse_resampled`` — the same after resampling both to 32 points
  by arc length (``evaluation: resampled``). A failure counts sqrt(2), the normalised image diagonal.
- answer (short text answers, with or without an image): ``accuracy`` — the fraction of answers the
  ``answer_match`` reward scores 1 (its matcher: the record's, else ``answer_matcher``); a failure is wrong.

Distances also come as ``*_valid`` means over parsed answers only. With several samples per record (sampled
decoding) every metric is the mean over samples.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from vlm_grpoma.answers import Answer, Boxes, ParseError, Points, Trajectory, answers_of_kind
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, MaskRef, Record, ShortAnswer
from vlm_grpoma.rewards.affordance import (
    AffordanceReward,
    distance_to_boxes,
    distance_to_points,
    points_in_boxes,
)
from vlm_grpoma.rewards.answer_match import matches
from vlm_grpoma.rewards.base import Completion
from vlm_grpoma.rewards.detection import box_iou, boxes_array, matched_score
from vlm_grpoma.rewards.format import FormatReward
from vlm_grpoma.rewards.trajectory import EVALUATIONS, FAILED_DISTANCE, normalised_distances

GROUNDING_TASKS = ("detection", "affordance", "trajectory")
#: What ``eval`` scores: the grounding tasks and short answers (manipulation: ``manip-eval``).
EVAL_TASKS = (*GROUNDING_TASKS, "answer")
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
    #: the prompt opened the thought (``thought_text`` lacks ``<think>``)
    thought_opened: bool = False


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
    #: Aggregate metrics; None where a metric does not apply (e.g. ``Acc@0.5`` with no single-box record).
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
                s[f"Acc@{t}"] = float(len(pred) > 0 and iou[0, 0] >= t)
        scores.append(s)
    n_gt = sum(s["gt_boxes"] for s in scores)
    single = [s for s in scores if f"Acc@{IOU_THRESHOLDS[0]}" in s]
    metrics: dict[str, float | None] = {}
    for t in IOU_THRESHOLDS:
        metrics[f"precision@{t}"] = sum(s[f"matched@{t}"] for s in scores) / n_gt if n_gt else None
    for t in IOU_THRESHOLDS:
        metrics[f"Acc@{t}"] = _mean([s[f"Acc@{t}"] for s in single])
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
    """Per answer: DFD, Hausdorff and RMSE of the normalised polylines, on the vertices and resampled."""
    for record, _ in pairs:
        if not isinstance(record.ground_truth, Trajectory) or len(record.ground_truth.points) < 2:
            raise ValueError(
                f"record {record.id}: trajectory evaluation needs a ground-truth trajectory of "
                f">= 2 points, got {record.ground_truth!r:.80}"
            )
    valid = [i for i, (_, a) in enumerate(pairs) if a is not None]
    sizes = np.array([(pairs[i][0].width, pairs[i][0].height) for i in valid], dtype=np.float64)
    sizes = sizes.reshape(-1, 2)
    preds = [pairs[i][1].points for i in valid]
    gts = [pairs[i][0].ground_truth.points for i in valid]
    short = {"frechet": "dfd", "hausdorff": "hausdorff", "rmse": "rmse"}
    names: list[str] = []
    scores: list[dict[str, float]] = [{} for _ in pairs]
    for evaluation in EVALUATIONS:
        dist = normalised_distances(preds, gts, sizes, evaluation, TRAJECTORY_POINTS)
        suffix = "" if evaluation == "vertex" else f"_{evaluation}"
        for metric, base in short.items():
            name = base + suffix
            names.append(name)
            for s in scores:
                s[name] = FAILED_DISTANCE
            for j, i in enumerate(valid):
                scores[i][name] = float(dist[metric][j])
    metrics: dict[str, float | None] = {}
    for name in names:
        metrics[name] = _mean([s[name] for s in scores])
        metrics[f"{name}_valid"] = _mean([scores[i][name] for i in valid])
    return scores, metrics, []


def answer_scorer(default_matcher: str = "exact") -> Scorer:
    """The short-answer scorer: per answer ``correct`` (1 when it matches the record's answer under the record's
    matcher, else ``default_matcher``, as the ``answer_match`` reward decides), then ``accuracy``."""

    def score(pairs, samples):
        scores = []
        for record, answer in pairs:
            truth = record.ground_truth
            if not isinstance(truth, ShortAnswer):
                raise ValueError(
                    f"record {record.id}: answer evaluation needs a short-answer ground truth, got "
                    f"{type(truth).__name__}"
                )
            scores.append(
                {"correct": float(answer is not None and matches(answer.text, truth, default_matcher))}
            )
        return scores, {"accuracy": _mean([s["correct"] for s in scores])}, []

    return score


SCORERS: dict[str, Scorer] = {
    "detection": _score_detection,
    "affordance": _score_affordance,
    "trajectory": _score_trajectory,
    "answer": answer_scorer(),
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
        return empty, ["COCO AP skipped: pycocotools is not installed (pip install pycocotools)"]
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


def score_predictions(
    predictions: Sequence[Prediction], samples: int = 1, greedy: bool = True, answer_matcher: str = "exact"
) -> EvalReport:
    """The metric layer, model-free: score parsed predictions against their records (module docstring);
    ``answer_matcher``: the short answers' matcher where a record names none (``answer_match``'s option)."""
    scorers = SCORERS | {"answer": answer_scorer(answer_matcher)}
    by_task: dict[str, list[int]] = {}
    for i, p in enumerate(predictions):
        if p.record.task not in scorers:
            raise ValueError(
                f"record {p.record.id}: task {p.record.task!r} is not evaluated here "
                f"({', '.join(EVAL_TASKS)}); evaluate manipulation with manip-eval"
            )
        by_task.setdefault(p.record.task, []).append(i)
    fmt = (
        FormatReward()
        .score(
            [Completion(p.answer, p.thought_text, p.answer_text, p.thought_opened) for p in predictions],
            [p.record for p in predictions],
        )
        .total
    )
    failures = [_failure(p.answer, p.record.task) for p in predictions]
    scored: list[ScoredPrediction | None] = [None] * len(predictions)
    tasks = {}
    for task in EVAL_TASKS:
        idx = by_task.get(task)
        if not idx:
            continue
        pairs = [(predictions[i].record, None if failures[i] else predictions[i].answer) for i in idx]
        per, metrics, notes = scorers[task](pairs, [predictions[i].sample for i in idx])
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
