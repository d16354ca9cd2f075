"""Trajectory reward: discrete Fréchet, Hausdorff and RMSE of the predicted against the ground-truth path.

``evaluation`` (``rewards.options.trajectory.evaluation``), where the metrics are taken:

- ``vertex`` (the default: the vertices, as RoboBrain / ShareRobot report DFD, HD and RMSE and as Embodied-R1
  rewards them; neither RoboBrain repository publishes its evaluation code): Fréchet and Hausdorff between the
  two vertex sequences; RMSE after interpolating both, linearly by vertex index, to max(N, M) points
  (Embodied-R1's ``compute_rmse_with_interpolation``; plain vertex RMSE when N = M).
- ``resampled`` (ours): both paths resampled to ``num_points`` points evenly spaced by arc length, so that the
  metrics do not depend on how densely either side was sampled; with unequal vertex counts the distances are
  smaller (measured 0.51× Fréchet, 0.61× Hausdorff, 0.23× RMSE of the vertex metrics).

``shaping`` (``rewards.options.trajectory.shaping``):

- ``linear`` (ours, the default): both paths divided by the image width/height, each metric shaped as
  ``max(0, 1 - d / max_distance)``, the total the weighted mean of the shaped terms (weights normalised to 1).
  Components ``frechet``, ``hausdorff``, ``rmse`` (shaped) and ``*_dist`` (raw, normalised units; a failed
  answer logs sqrt(2), the normalised image diagonal).
- ``embodied_r1``: Embodied-R1's ``fsd_visual_trace`` reward (pickxiguapi/Embodied-R1,
  ``verl/utils/reward_score/embodiedr1.py``) without its thinking-format term (0.1, the ``format`` reward's
  job): ``0.1·point_format + 0.1·[exactly 8 points] + 0.3·s(DFD; 10, 100) + 0.4·s(RMSE; 5, 50)``, distances in
  pixels on the vertices (``evaluation`` must be ``vertex``), ``s(d; lo, hi) = clip(1 - (d - lo) / (hi - lo),
  0, 1)``, the distance terms 0 unless the answer has exactly 8 points. Range [0, 0.9]; Embodied-R1's overall
  reward is this plus 0.1 of its format reward. Components ``point_num``, ``frechet``, ``rmse`` (shaped) and
  ``frechet_dist``, ``rmse_dist`` (pixels; a failure logs the image diagonal).

Pixels are the record's (original image); Embodied-R1 measures in the image the model sees, the same unless the
processor resizes it. A parse failure scores 0 (Embodied-R1 still gives 0.1 when a ``<point>`` tag is present).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

from vlm_grpoma.answers import Trajectory
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers

METRICS = ("frechet", "hausdorff", "rmse")
FAILED_DISTANCE = float(np.sqrt(2.0))
Evaluation = Literal["vertex", "resampled"]
EVALUATIONS = ("vertex", "resampled")
Shaping = Literal["linear", "embodied_r1"]
SHAPINGS = ("linear", "embodied_r1")
#: Embodied-R1: the answer must have this many points; (full-reward, zero-reward) pixel distances.
EMBODIED_R1_POINTS = 8
EMBODIED_R1_FRECHET_PX = (10.0, 100.0)
EMBODIED_R1_RMSE_PX = (5.0, 50.0)


def resample_polyline(points: np.ndarray, n: int) -> np.ndarray:
    """Points evenly spaced by arc length along polylines [..., L, 2] (L >= 1) -> [..., n, 2], ends kept.

    Vectorised over the leading dims; a polyline of zero length becomes n copies of its first point.
    """
    p = np.asarray(points, dtype=np.float64)
    if p.shape[-2] == 1:
        return np.repeat(p, n, axis=-2)
    seg = np.hypot(*np.moveaxis(np.diff(p, axis=-2), -1, 0))  # [..., L-1]
    s = np.concatenate([np.zeros(seg.shape[:-1] + (1,)), np.cumsum(seg, axis=-1)], axis=-1)  # [..., L]
    t = np.linspace(0.0, 1.0, n) * s[..., -1:]  # [..., n]
    # segment k holding t: the last vertex with s[k] <= t (skips zero-length segments), at most L-2
    k = np.minimum((s[..., None, :] <= t[..., :, None]).sum(axis=-1) - 1, p.shape[-2] - 2)
    s0, s1 = np.take_along_axis(s, k, axis=-1), np.take_along_axis(s, k + 1, axis=-1)
    frac = np.divide(t - s0, s1 - s0, out=np.zeros_like(t), where=s1 > s0)[..., None]
    p0 = np.take_along_axis(p, k[..., None], axis=-2)
    p1 = np.take_along_axis(p, k[..., None] + 1, axis=-2)
    return p0 + np.clip(frac, 0.0, 1.0) * (p1 - p0)


def interpolate_by_index(points: np.ndarray, n: int) -> np.ndarray:
    """Polylines [..., L, 2] linearly interpolated at n points evenly spaced in vertex index -> [..., n, 2]
    (``np.interp`` of x and y over ``linspace(0, 1, L)``, as Embodied-R1 does)."""
    p = np.asarray(points, dtype=np.float64)
    length = p.shape[-2]
    if length == 1:
        return np.repeat(p, n, axis=-2)
    t = np.linspace(0.0, 1.0, n) * (length - 1)
    k = np.minimum(np.floor(t).astype(int), length - 2)
    frac = (t - k)[:, None]
    return p[..., k, :] + frac * (p[..., k + 1, :] - p[..., k, :])


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[..., N, M] Euclidean distances between points a [..., N, 2] and b [..., M, 2]."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    dx = a[..., :, None, 0] - b[..., None, :, 0]
    dy = a[..., :, None, 1] - b[..., None, :, 1]
    return np.sqrt(dx * dx + dy * dy)


@lru_cache(maxsize=64)
def _skew_index(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Row/column indices of cell (i, k - i) at [k, i] (columns clipped; only the valid range is read)."""
    k, i = np.meshgrid(np.arange(n + m - 1), np.arange(n), indexing="ij")
    return i, np.clip(k - i, 0, m - 1)


def frechet_from_distances(d: np.ndarray) -> np.ndarray:
    """Discrete Fréchet distance [...] from the pairwise distance matrix d [..., N, M].

    ``c[i, j] = max(d[i, j], min(c[i-1, j], c[i-1, j-1], c[i, j-1]))``, computed one anti-diagonal at a
    time. Stored skewed (row k = anti-diagonal k, batch last) the three predecessors of a diagonal are
    contiguous slices of the two previous rows, so each step is a few vectorised slice operations.
    """
    n, m = d.shape[-2:]
    rows, cols = _skew_index(n, m)
    batch = d.shape[:-2]
    skew = np.moveaxis(d, (-2, -1), (0, 1))[rows, cols]  # [n+m-1, n, ...]
    # c_skew[k + 2, i + 1] = c[i, k - i]; the +inf padding is the DP border, c_skew[0, 0] = 0 starts it
    c = np.full((n + m + 1, n + 1) + batch, np.inf)
    c[0, 0] = 0.0
    for k in range(n + m - 1):
        lo, hi = max(0, k - m + 1), min(k, n - 1) + 1
        prev = np.minimum(np.minimum(c[k + 1, lo:hi], c[k + 1, lo + 1 : hi + 1]), c[k, lo:hi])
        c[k + 2, lo + 1 : hi + 1] = np.maximum(skew[k, lo:hi], prev)
    return c[n + m, n]


def hausdorff_from_distances(d: np.ndarray) -> np.ndarray:
    """Symmetric Hausdorff distance [...] from the pairwise distance matrix d [..., N, M]."""
    return np.maximum(d.min(axis=-1).max(axis=-1), d.min(axis=-2).max(axis=-1))


def rmse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Root mean squared distance [...] between corresponding points of a and b [..., N, 2]."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return np.sqrt(np.mean(np.sum(diff * diff, axis=-1), axis=-1))


def trajectory_distances(preds: np.ndarray, gts: np.ndarray, chunk: int = 256) -> dict[str, np.ndarray]:
    """All three metrics for resampled polylines preds, gts [B, n, 2] -> {metric: [B]}, in chunks of B."""
    out = {metric: np.zeros(len(preds)) for metric in METRICS}
    for lo in range(0, len(preds), chunk):
        a, b = preds[lo : lo + chunk], gts[lo : lo + chunk]
        d = pairwise_distances(a, b)
        out["frechet"][lo : lo + chunk] = frechet_from_distances(d)
        out["hausdorff"][lo : lo + chunk] = hausdorff_from_distances(d)
        out["rmse"][lo : lo + chunk] = rmse(a, b)
    return out


def vertex_distances(
    preds: Sequence[np.ndarray], gts: Sequence[np.ndarray], chunk: int = 256
) -> dict[str, np.ndarray]:
    """The three metrics on the vertices of pred [N_i, 2] and gt [M_i, 2] polylines -> {metric: [B]}: Fréchet and
    Hausdorff between the vertices, RMSE after :func:`interpolate_by_index` of both to max(N, M) points. Pairs
    of equal (N, M) are computed together, ``chunk`` at a time."""
    out = {metric: np.zeros(len(preds)) for metric in METRICS}
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (p, g) in enumerate(zip(preds, gts, strict=True)):
        groups[(len(p), len(g))].append(i)
    for (n, m), members in groups.items():
        for lo in range(0, len(members), chunk):
            idx = members[lo : lo + chunk]
            a, b = np.stack([preds[i] for i in idx]), np.stack([gts[i] for i in idx])
            d = pairwise_distances(a, b)
            out["frechet"][idx] = frechet_from_distances(d)
            out["hausdorff"][idx] = hausdorff_from_distances(d)
            out["rmse"][idx] = rmse(interpolate_by_index(a, max(n, m)), interpolate_by_index(b, max(n, m)))
    return out


def normalised_distances(
    preds: Sequence[Sequence[tuple[float, float]]],
    gts: Sequence[Sequence[tuple[float, float]]],
    sizes: np.ndarray,
    evaluation: Evaluation,
    num_points: int = 32,
) -> dict[str, np.ndarray]:
    """The three metrics of pixel polylines divided by their image (width, height) [B, 2], on the vertices or
    resampled to ``num_points`` (module docstring) -> {metric: [B]}."""
    if evaluation == "resampled":
        return trajectory_distances(
            resample_normalised(preds, sizes, num_points), resample_normalised(gts, sizes, num_points)
        )
    scale = [np.asarray(size, dtype=np.float64) for size in sizes]
    return vertex_distances(
        [np.asarray(p, dtype=np.float64).reshape(-1, 2) / s for p, s in zip(preds, scale)],
        [np.asarray(g, dtype=np.float64).reshape(-1, 2) / s for g, s in zip(gts, scale)],
    )


def embodied_r1_shaped(distance: np.ndarray, low: float, high: float) -> np.ndarray:
    """Embodied-R1's ``distance_to_reward``: 1 up to ``low``, 0 from ``high``, linear between."""
    return np.clip(1.0 - (distance - low) / (high - low), 0.0, 1.0)


def resample_normalised(
    polylines: Sequence[Sequence[tuple[float, float]]], sizes: np.ndarray, n: int, chunk: int = 256
) -> np.ndarray:
    """Polylines in pixels, divided by their image (width, height) [B, 2], resampled -> [B, n, 2].

    Polylines with the same number of vertices are resampled together, ``chunk`` at a time.
    """
    out = np.empty((len(polylines), n, 2))
    groups: dict[int, list[int]] = defaultdict(list)
    for i, poly in enumerate(polylines):
        groups[len(poly)].append(i)
    for length, members in groups.items():
        for lo in range(0, len(members), chunk):
            idx = members[lo : lo + chunk]
            pts = np.array([polylines[i] for i in idx], dtype=np.float64).reshape(len(idx), length, 2)
            out[idx] = resample_polyline(pts / sizes[idx, None, :], n)
    return out


class TrajectoryReward:
    """Fréchet / Hausdorff / RMSE of the predicted against the ground-truth trajectory, shaped (module docstring)."""

    def __init__(
        self,
        num_points: int = 32,
        max_distance: float = 0.5,
        frechet_weight: float = 1.0,
        hausdorff_weight: float = 1.0,
        rmse_weight: float = 1.0,
        evaluation: Evaluation = "vertex",
        shaping: Shaping = "linear",
    ) -> None:
        weights = {"frechet": frechet_weight, "hausdorff": hausdorff_weight, "rmse": rmse_weight}
        if num_points < 2:
            raise ValueError(f"trajectory reward: num_points must be >= 2, got {num_points}")
        if not max_distance > 0:
            raise ValueError(f"trajectory reward: max_distance must be > 0, got {max_distance}")
        if any(not w >= 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"trajectory reward: weights must be >= 0 with a positive sum, got {weights}")
        if evaluation not in EVALUATIONS:
            raise ValueError(
                f"trajectory reward: evaluation must be one of {', '.join(EVALUATIONS)}, got {evaluation!r}"
            )
        if shaping not in SHAPINGS:
            raise ValueError(
                f"trajectory reward: shaping must be one of {', '.join(SHAPINGS)}, got {shaping!r}"
            )
        if shaping == "embodied_r1" and evaluation != "vertex":
            raise ValueError(
                "trajectory reward: shaping 'embodied_r1' is published on the vertices; evaluation must be 'vertex'"
            )
        total = sum(weights.values())
        self.weights = {k: w / total for k, w in weights.items()}
        self.num_points, self.max_distance = num_points, max_distance
        self.evaluation, self.shaping = evaluation, shaping

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        indices, answers, failures = valid_answers("trajectory", completions, records, "trajectory")
        for i in indices:
            gt = records[i].ground_truth
            if not isinstance(gt, Trajectory) or len(gt.points) < 2:
                raise ValueError(
                    f"record {records[i].id}: trajectory reward needs a ground-truth trajectory "
                    f"of >= 2 points, got {gt!r:.80}"
                )
        sizes = np.array([(records[i].width, records[i].height) for i in indices], dtype=np.float64).reshape(
            -1, 2
        )
        preds = [a.points for a in answers]
        gts = [records[i].ground_truth.points for i in indices]
        if self.shaping == "embodied_r1":
            return self._embodied_r1(records, indices, preds, gts, failures)
        distances = normalised_distances(preds, gts, sizes, self.evaluation, self.num_points)
        n = len(completions)
        total = np.zeros(n)
        components = {}
        for metric, dist in distances.items():
            shaped = np.clip(1.0 - dist / self.max_distance, 0.0, 1.0)
            total[indices] += self.weights[metric] * shaped
            comp, raw = np.zeros(n), np.full(n, FAILED_DISTANCE)
            comp[indices], raw[indices] = shaped, dist
            components[metric], components[f"{metric}_dist"] = comp.tolist(), raw.tolist()
        return RewardResult(np.clip(total, 0.0, 1.0).tolist(), components, failures)

    def _embodied_r1(self, records, indices, preds, gts, failures) -> RewardResult:
        """Embodied-R1's trajectory terms on pixel vertices (module docstring)."""
        n = len(records)
        dist = vertex_distances(
            [np.asarray(p, dtype=np.float64) for p in preds], [np.asarray(g, dtype=np.float64) for g in gts]
        )
        point_num = np.array([len(p) == EMBODIED_R1_POINTS for p in preds], dtype=np.float64)
        shaped = {
            "point_num": point_num,
            "frechet": point_num * embodied_r1_shaped(dist["frechet"], *EMBODIED_R1_FRECHET_PX),
            "rmse": point_num * embodied_r1_shaped(dist["rmse"], *EMBODIED_R1_RMSE_PX),
        }
        total = np.zeros(n)
        total[indices] = 0.1 + 0.1 * shaped["point_num"] + 0.3 * shaped["frechet"] + 0.4 * shaped["rmse"]
        components = {}
        for name, values in shaped.items():
            comp = np.zeros(n)
            comp[indices] = values
            components[name] = comp.tolist()
        for metric in ("frechet", "rmse"):
            raw = np.array([float(np.hypot(r.width, r.height)) for r in records])
            raw[indices] = dist[metric]
            components[f"{metric}_dist"] = raw.tolist()
        return RewardResult(total.tolist(), components, failures)
