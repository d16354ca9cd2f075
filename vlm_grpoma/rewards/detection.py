"""Box rewards: IoU / GIoU with optimal one-to-one matching (VLM-R1, Visual-RFT).

``reward = Σ matched score / max(#pred, #gt)`` where the matching (scipy's ``linear_sum_assignment``)
maximises the summed score. Score per pair: IoU (mode ``"iou"``), or GIoU mapped to [0, 1] as
``(giou + 1) / 2`` (mode ``"giou"``; disjoint far-apart boxes then still earn up to 0.5, so it is a shaping
term rather than an accuracy). ``threshold``: a pair scoring below it counts 0 (and the matching is done on
these thresholded scores); at or above it counts its continuous score — Visual-RFT's "matched at IoU > 0.5".
Empty ground truth (a negative): no predicted boxes scores 1, any box scores 0. Labels are ignored.
Result range: [0, 1].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from vlm_grpoma.answers import Boxes
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers

Mode = Literal["iou", "giou"]


def _area(b: np.ndarray) -> np.ndarray:
    return np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den is 0 (degenerate ground-truth boxes)."""
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape)), where=den > 0)


def _iou_parts(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise intersection and union areas of boxes ``a`` [..., N, 4] and ``b`` [..., M, 4]."""
    a, b = a[..., :, None, :], b[..., None, :, :]
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = w * h
    return inter, _area(a) + _area(b) - inter


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU [..., N, M] of xyxy boxes ``a`` [..., N, 4] and ``b`` [..., M, 4] (leading dims broadcast)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    inter, union = _iou_parts(a, b)
    return _safe_div(inter, union)


def generalized_box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise GIoU [..., N, M] in [-1, 1]: IoU minus the enclosing box's share not covered by the union."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    inter, union = _iou_parts(a, b)
    lo = np.minimum(a[..., :, None, :2], b[..., None, :, :2])
    hi = np.maximum(a[..., :, None, 2:], b[..., None, :, 2:])
    hull = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    return _safe_div(inter, union) - _safe_div(hull - union, hull)


def pair_scores(pred: np.ndarray, gt: np.ndarray, mode: Mode = "iou") -> np.ndarray:
    """Per-pair score in [0, 1]: IoU, or GIoU mapped as (giou + 1) / 2."""
    if mode == "iou":
        return box_iou(pred, gt)
    if mode == "giou":
        return (generalized_box_iou(pred, gt) + 1.0) / 2.0
    raise ValueError(f"unknown box score mode {mode!r}; expected 'iou' or 'giou'")


class MatchScore(NamedTuple):
    #: Σ matched (thresholded) scores / max(#pred, #gt), in [0, 1].
    score: float
    #: Mean thresholded score of the matched pairs (0 when nothing can be matched).
    matched_mean: float


def matched_score(scores: np.ndarray, threshold: float = 0.0) -> MatchScore:
    """Optimal one-to-one matching of a [#pred, #gt] score matrix; see the module docstring."""
    n_pred, n_gt = scores.shape
    if n_pred == 0 or n_gt == 0:
        return MatchScore(1.0 if n_pred == n_gt else 0.0, 0.0)
    s = np.where(scores >= threshold, scores, 0.0)
    rows, cols = linear_sum_assignment(s, maximize=True)
    matched = s[rows, cols]
    return MatchScore(float(matched.sum()) / max(n_pred, n_gt), float(matched.mean()))


def batch_matched_scores(
    preds: Sequence[np.ndarray], gts: Sequence[np.ndarray], mode: Mode = "iou", threshold: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`matched_score` over many (pred [N_i, 4], gt [M_i, 4]) pairs -> (score [B], matched_mean [B]).

    Pairs with equal (N, M) share one vectorised score computation; 1×1 pairs need no assignment solver.
    """
    score, matched_mean = np.zeros(len(preds)), np.zeros(len(preds))
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (p, g) in enumerate(zip(preds, gts, strict=True)):
        groups[(len(p), len(g))].append(i)
    for (n, m), idx in groups.items():
        if n == 0 or m == 0:
            score[idx] = 1.0 if n == m else 0.0
            continue
        s = pair_scores(np.stack([preds[i] for i in idx]), np.stack([gts[i] for i in idx]), mode)
        if n == 1 and m == 1:
            s = s[:, 0, 0]
            score[idx] = matched_mean[idx] = np.where(s >= threshold, s, 0.0)
            continue
        for j, i in enumerate(idx):
            score[i], matched_mean[i] = matched_score(s[j], threshold)
    return score, matched_mean


def boxes_array(boxes: Boxes) -> np.ndarray:
    """[N, 4] float64 xyxy array of a Boxes answer or ground truth."""
    return np.array([(b.x1, b.y1, b.x2, b.y2) for b in boxes.boxes], dtype=np.float64).reshape(-1, 4)


class IoUReward:
    """Matched IoU/GIoU of predicted boxes against the record's boxes, in [0, 1].

    Components: ``matched`` (mean score of matched pairs: localisation quality) and ``count`` (
    min(#pred, #gt) / max(#pred, #gt), 1 when both are empty: counting quality).
    """

    def __init__(self, mode: Mode = "iou", threshold: float = 0.0) -> None:
        if mode not in ("iou", "giou"):
            raise ValueError(f"iou reward: mode must be 'iou' or 'giou', got {mode!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"iou reward: threshold must be in [0, 1], got {threshold}")
        self.mode, self.threshold = mode, threshold

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        n = len(completions)
        indices, answers, failures = valid_answers("iou", completions, records, "boxes")
        gts = []
        for i in indices:
            gt = records[i].ground_truth
            if not isinstance(gt, Boxes):
                raise ValueError(
                    f"record {records[i].id}: iou reward needs box ground truth, got {type(gt).__name__}"
                )
            gts.append(boxes_array(gt))
        preds = [boxes_array(a) for a in answers]
        score, matched = batch_matched_scores(preds, gts, self.mode, self.threshold)
        counts = np.array(
            [
                min(len(p), len(g)) / max(len(p), len(g), 1) if len(p) or len(g) else 1.0
                for p, g in zip(preds, gts)
            ]
        )
        total, matched_c, count_c = np.zeros(n), np.zeros(n), np.zeros(n)
        total[indices], matched_c[indices], count_c[indices] = score, matched, counts
        return RewardResult(
            total.tolist(), {"matched": matched_c.tolist(), "count": count_c.tolist()}, failures
        )
