"""Trajectory reward (RoboBrain / ShareRobot metrics, Embodied-R1-style shaping). Range: [0, 1].

Both polylines are normalised by the image width/height, then resampled to ``num_points`` points evenly
spaced by arc length (so the metrics do not depend on how densely either side was sampled). Metrics on the
resampled polylines: discrete Fréchet distance, symmetric Hausdorff distance, and RMSE between corresponding
points. Each is shaped as ``max(0, 1 - d / max_distance)``; the total is the weighted mean of the shaped
terms (weights normalised to sum 1). Components: ``frechet``, ``hausdorff``, ``rmse`` (shaped) and
``frechet_dist``, ``hausdorff_dist``, ``rmse_dist`` (raw, normalised units; a failed answer logs sqrt(2),
the diagonal of the normalised image, as its raw distance).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from vlm_grpoma.answers import Trajectory
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers

METRICS = ("frechet", "hausdorff", "rmse")
FAILED_DISTANCE = float(np.sqrt(2.0))


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


def discrete_frechet(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Discrete Fréchet distance [...] between polylines a [..., N, 2] and b [..., M, 2]."""
    return frechet_from_distances(pairwise_distances(a, b))


def hausdorff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Symmetric Hausdorff distance [...] between point sets a [..., N, 2] and b [..., M, 2]."""
    return hausdorff_from_distances(pairwise_distances(a, b))


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
    """Shaped Fréchet / Hausdorff / RMSE of the predicted against the ground-truth trajectory; in [0, 1]."""

    def __init__(
        self,
        num_points: int = 32,
        max_distance: float = 0.5,
        frechet_weight: float = 1.0,
        hausdorff_weight: float = 1.0,
        rmse_weight: float = 1.0,
    ) -> None:
        weights = {"frechet": frechet_weight, "hausdorff": hausdorff_weight, "rmse": rmse_weight}
        if num_points < 2:
            raise ValueError(f"trajectory reward: num_points must be >= 2, got {num_points}")
        if not max_distance > 0:
            raise ValueError(f"trajectory reward: max_distance must be > 0, got {max_distance}")
        if any(not w >= 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"trajectory reward: weights must be >= 0 with a positive sum, got {weights}")
        total = sum(weights.values())
        self.weights = {k: w / total for k, w in weights.items()}
        self.num_points, self.max_distance = num_points, max_distance

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        n = len(completions)
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
        preds = resample_normalised([a.points for a in answers], sizes, self.num_points)
        gts = resample_normalised([records[i].ground_truth.points for i in indices], sizes, self.num_points)
        distances = trajectory_distances(preds, gts)
        total = np.zeros(n)
        components = {}
        for metric, dist in distances.items():
            shaped = np.clip(1.0 - dist / self.max_distance, 0.0, 1.0)
            total[indices] += self.weights[metric] * shaped
            comp, raw = np.zeros(n), np.full(n, FAILED_DISTANCE)
            comp[indices], raw[indices] = shaped, dist
            components[metric], components[f"{metric}_dist"] = comp.tolist(), raw.tolist()
        return RewardResult(np.clip(total, 0.0, 1.0).tolist(), components, failures)
