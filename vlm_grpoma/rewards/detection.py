"""Box rewards: IoU / GIoU of the predicted against the ground-truth boxes, with one of three matchings.

``matching`` (``rewards.options.iou.matching``):

- ``hungarian`` (ours, the default): optimal one-to-one matching (scipy's ``linear_sum_assignment``) maximising
  the summed score; ``reward = Σ matched score / max(#pred, #gt)``. Score per pair: IoU (mode ``"iou"``), or
  GIoU mapped to [0, 1] as ``(giou + 1) / 2`` (mode ``"giou"``; disjoint far-apart boxes then still earn up to
  0.5, so it is a shaping term rather than an accuracy). ``threshold`` (default 0): a pair scoring below it
  counts 0 (the matching is done on these thresholded scores); at or above it counts its continuous score.
  Empty ground truth (a negative): no predicted boxes scores 1, any box scores 0. The default because it is
  the only one of the three that does not depend on the order of the predicted boxes and never matches a box
  worse than an available better assignment; its continuous score at threshold 0 gives a signal before any
  box reaches IoU 0.5.
- ``visual_rft``: Visual-RFT's ``accuracy_reward_iou`` (Liuziyu77/Visual-RFT, ``src/virft/src/open_r1/grpo.py``:
  ``remove_duplicates``, ``sort_and_calculate_iou``, ``compute_reward_iou_v2``). Exact duplicate predicted boxes
  are dropped; each predicted box in turn (Visual-RFT sorts by confidence; our answers carry none, so in answer
  order, as its stable sort keeps equal confidences) takes the unmatched ground-truth box of highest IoU
  (first on ties), which counts its IoU if it EXCEEDS ``threshold`` (default 0.5) and 0 otherwise (the box
  stays unmatched); ``reward = min(1, Σ / max(#gt, #pred))``. No predicted boxes scores 0, also on a negative.
- ``vlm_r1``: VLM-R1's ``detection_score`` (om-ai-lab/VLM-R1,
  ``src/open-r1-multimodal/src/open_r1/grpo_jsonl.py``, accuracy method ``weighted_sum``). IoU with VLM-R1's
  pixel convention (``iou``: the intersection spans ``max(x1) .. min(x2 - 1)`` plus one pixel, and is empty
  unless that span is positive); greedy matching, the largest remaining IoU first, while it is at least
  ``threshold`` (default 0.5); a matched pair whose labels differ (case-insensitively) counts IoU 0.
  ``reward = (0.7·Σ IoU / #gt + 0.3·(1 − (missed/#gt + unmatched/#pred) / 2)) / 1.0`` (label weight 0).
  Empty ground truth: 1 for no boxes, else 0; no predicted boxes: 0.

Labels are ignored except by ``vlm_r1``. Result range: [0, 1].
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
Matching = Literal["hungarian", "visual_rft", "vlm_r1"]
MATCHINGS = ("hungarian", "visual_rft", "vlm_r1")
#: The default threshold of each matching (its source's).
DEFAULT_THRESHOLD = {"hungarian": 0.0, "visual_rft": 0.5, "vlm_r1": 0.5}


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


def visual_rft_score(pred: np.ndarray, gt: np.ndarray, threshold: float = 0.5) -> MatchScore:
    """Visual-RFT's matched IoU of boxes pred [N, 4] (in answer order) and gt [M, 4]; see the module docstring."""
    if len(pred) == 0:
        return MatchScore(0.0, 0.0)
    unique = list(dict.fromkeys(map(tuple, pred)))  # first occurrence of each exact box, order kept
    iou = box_iou(np.array(unique), gt)
    taken: set[int] = set()
    kept = []
    for row in iou:
        best, match = 0.0, -1
        for j, value in enumerate(row):
            if j not in taken and value > best:
                best, match = float(value), j
        if best > threshold:
            kept.append(best)
            taken.add(match)
    total = min(1.0, sum(kept) / max(len(gt), len(unique)))
    return MatchScore(total, float(np.mean(kept)) if kept else 0.0)


def vlm_r1_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU [N, M] by VLM-R1's ``iou``: inclusive pixel intersection, exclusive-corner areas."""
    a, b = np.asarray(a, dtype=np.float64)[:, None, :], np.asarray(b, dtype=np.float64)[None, :, :]
    x1, y1 = np.maximum(a[..., 0], b[..., 0]), np.maximum(a[..., 1], b[..., 1])
    x2, y2 = np.minimum(a[..., 2] - 1, b[..., 2] - 1), np.minimum(a[..., 3] - 1, b[..., 3] - 1)
    inter = np.where((x1 < x2) & (y1 < y2), (x2 - x1 + 1) * (y2 - y1 + 1), 0.0)
    union = _area(a) + _area(b) - inter
    return _safe_div(inter, union)


def vlm_r1_score(
    pred: np.ndarray,
    gt: np.ndarray,
    pred_labels: Sequence[str],
    gt_labels: Sequence[str],
    threshold: float = 0.5,
) -> MatchScore:
    """VLM-R1's ``detection_score`` of boxes pred [N, 4] and gt [M, 4] with their labels; module docstring."""
    if len(gt) == 0:
        return MatchScore(1.0 if len(pred) == 0 else 0.0, 0.0)
    if len(pred) == 0:
        return MatchScore(0.0, 0.0)
    iou = vlm_r1_iou(pred, gt)
    free = np.ones_like(iou, dtype=bool)
    matched, labels_right = [], 0
    while free.any():
        i, j = np.unravel_index(np.argmax(np.where(free, iou, -1.0)), iou.shape)  # first maximum, pred-major
        if iou[i, j] < threshold:
            break
        right = pred_labels[i].lower() == gt_labels[j].lower()
        matched.append(float(iou[i, j]) if right else 0.0)
        labels_right += right
        free[i, :] = free[:, j] = False
    n_pred, n_gt = len(pred), len(gt)
    position = sum(matched) / n_gt if matched else 0.0
    label = labels_right / n_gt if matched else 0.0
    completeness = 1.0 - ((n_gt - len(matched)) / n_gt + (n_pred - len(matched)) / n_pred) / 2.0
    alpha, beta, gamma = 0.7, 0.0, 0.3
    total = (alpha * position + beta * label + gamma * completeness) / (alpha + beta + gamma)
    return MatchScore(total, float(np.mean(matched)) if matched else 0.0)


def boxes_array(boxes: Boxes) -> np.ndarray:
    """[N, 4] float64 xyxy array of a Boxes answer or ground truth."""
    return np.array([(b.x1, b.y1, b.x2, b.y2) for b in boxes.boxes], dtype=np.float64).reshape(-1, 4)


class IoUReward:
    """Matched IoU/GIoU of predicted boxes against the record's boxes, in [0, 1] (``matching``: module docstring).

    Components: ``matched`` (mean score of the matched pairs: localisation quality) and ``count`` (
    min(#pred, #gt) / max(#pred, #gt), 1 when both are empty: counting quality).
    """

    def __init__(
        self, mode: Mode = "iou", threshold: float | None = None, matching: Matching = "hungarian"
    ) -> None:
        if mode not in ("iou", "giou"):
            raise ValueError(f"iou reward: mode must be 'iou' or 'giou', got {mode!r}")
        if matching not in MATCHINGS:
            raise ValueError(f"iou reward: matching must be one of {', '.join(MATCHINGS)}, got {matching!r}")
        if matching != "hungarian" and mode != "iou":
            raise ValueError(
                f"iou reward: matching {matching!r} scores IoU as its source does; mode must be 'iou'"
            )
        threshold = DEFAULT_THRESHOLD[matching] if threshold is None else threshold
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"iou reward: threshold must be in [0, 1], got {threshold}")
        self.mode, self.threshold, self.matching = mode, threshold, matching

    def _scores(self, answers: Sequence[Boxes], truths: Sequence[Boxes]) -> tuple[np.ndarray, np.ndarray]:
        """(score [B], matched mean [B]) of each answer against its ground truth under ``matching``."""
        preds, gts = [boxes_array(a) for a in answers], [boxes_array(g) for g in truths]
        if self.matching == "hungarian":
            return batch_matched_scores(preds, gts, self.mode, self.threshold)
        if self.matching == "visual_rft":
            scored = [visual_rft_score(p, g, self.threshold) for p, g in zip(preds, gts)]
        else:
            scored = [
                vlm_r1_score(p, g, [b.label for b in a.boxes], [b.label for b in t.boxes], self.threshold)
                for p, g, a, t in zip(preds, gts, answers, truths)
            ]
        return np.array([s.score for s in scored]), np.array([s.matched_mean for s in scored])

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        n = len(completions)
        indices, answers, failures = valid_answers("iou", completions, records, "boxes")
        truths = []
        for i in indices:
            gt = records[i].ground_truth
            if not isinstance(gt, Boxes):
                raise ValueError(
                    f"record {records[i].id}: iou reward needs box ground truth, got {type(gt).__name__}"
                )
            truths.append(gt)
        score, matched = self._scores(answers, truths)
        counts = np.array(
            [
                min(len(a.boxes), len(g.boxes)) / max(len(a.boxes), len(g.boxes), 1)
                if a.boxes or g.boxes
                else 1.0
                for a, g in zip(answers, truths)
            ]
        )
        total, matched_c, count_c = np.zeros(n), np.zeros(n), np.zeros(n)
        total[indices], matched_c[indices], count_c[indices] = score, matched, counts
        return RewardResult(
            total.tolist(), {"matched": matched_c.tolist(), "count": count_c.tolist()}, failures
        )
