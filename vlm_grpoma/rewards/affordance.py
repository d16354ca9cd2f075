"""Affordance / pointing reward (RoboPoint, Where2Place, Embodied-R1). Range: [0, 1].

Ground truth and total reward:
- ``MaskRef``: fraction of predicted points inside the mask (non-zero pixels). A point (x, y) falls in pixel
  (floor(x), floor(y)); points outside the image are outside the mask.
- ``Boxes``: fraction of predicted points inside any box (borders included).
- ``Points``: mean over predicted points of a linear shaping of the distance d to the nearest ground-truth
  point: 1 at d <= r_in, 0 at d >= r_out. Radii are given in pixels at ``reference_diagonal`` (default 10 and
  50 px at 800 px, a 640×480 image, as Embodied-R1) and scale with the record's image diagonal.
Components: ``in_region`` — fraction of points inside the region (mask, boxes, or within r_in of a gt
point); ``distance`` — the shaped distance score for every ground-truth kind (distance to the nearest mask
pixel via a Euclidean distance transform, to the nearest box, or to the nearest point).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.ndimage import distance_transform_edt

from vlm_grpoma.answers import Boxes, Points
from vlm_grpoma.datasets.schema import MaskRef, Record
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers
from vlm_grpoma.rewards.detection import boxes_array


def linear_shape(d: np.ndarray, r_in: float, r_out: float) -> np.ndarray:
    """1 for d <= r_in, 0 for d >= r_out, linear between."""
    return np.clip((r_out - np.asarray(d, dtype=np.float64)) / (r_out - r_in), 0.0, 1.0)


def points_in_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """[P] bool: point inside any of the xyxy boxes (borders included)."""
    x, y = points[:, 0:1], points[:, 1:2]
    inside = (x >= boxes[:, 0]) & (x <= boxes[:, 2]) & (y >= boxes[:, 1]) & (y <= boxes[:, 3])
    return inside.any(axis=1)


def distance_to_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """[P] Euclidean distance from each point to the nearest box (0 inside)."""
    dx = np.maximum(np.maximum(boxes[:, 0] - points[:, 0:1], points[:, 0:1] - boxes[:, 2]), 0.0)
    dy = np.maximum(np.maximum(boxes[:, 1] - points[:, 1:2], points[:, 1:2] - boxes[:, 3]), 0.0)
    return np.hypot(dx, dy).min(axis=1)


def distance_to_points(points: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """[P] Euclidean distance from each point to the nearest target point."""
    return np.hypot(points[:, 0:1] - targets[:, 0], points[:, 1:2] - targets[:, 1]).min(axis=1)


@dataclass(frozen=True)
class Mask:
    """A loaded target mask and, per pixel, the distance to the nearest mask pixel (0 inside)."""

    inside: np.ndarray  # [H, W] bool
    distance: np.ndarray  # [H, W] float32

    @classmethod
    def load(cls, path: str, record: Record) -> Mask:
        if not Path(path).is_file():
            raise FileNotFoundError(f"record {record.id}: mask file not found: {path}")
        with Image.open(path) as img:
            arr = np.asarray(img)
            if arr.ndim == 3 and img.mode in ("RGBA", "LA", "PA"):
                arr = arr[..., :-1]
        inside = arr.any(axis=-1) if arr.ndim == 3 else arr != 0
        if inside.shape != (record.height, record.width):
            raise ValueError(
                f"record {record.id}: mask {path} is {inside.shape[1]}x{inside.shape[0]}, "
                f"image is {record.width}x{record.height}"
            )
        if inside.any():
            distance = distance_transform_edt(~inside).astype(np.float32)
        else:
            distance = np.full(inside.shape, np.inf, dtype=np.float32)
        return cls(inside, distance)

    @property
    def nbytes(self) -> int:
        return self.inside.nbytes + self.distance.nbytes

    def lookup(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(inside [P] bool, distance [P]) at the pixels under the points; off-image points are outside and
        their distance adds the distance to the image border."""
        h, w = self.inside.shape
        cols, rows = np.floor(points[:, 0]), np.floor(points[:, 1])
        on_image = (cols >= 0) & (cols < w) & (rows >= 0) & (rows < h)
        ci, ri = np.clip(cols, 0, w - 1).astype(np.intp), np.clip(rows, 0, h - 1).astype(np.intp)
        beyond = np.hypot(cols - ci, rows - ri)
        return on_image & self.inside[ri, ci], self.distance[ri, ci] + beyond


class MaskCache:
    """Masks loaded once per path, least recently used evicted beyond ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._masks: OrderedDict[str, Mask] = OrderedDict()
        self._bytes = 0

    def get(self, record: Record, ref: MaskRef) -> Mask:
        mask = self._masks.get(ref.path)
        if mask is not None:
            self._masks.move_to_end(ref.path)
            return mask
        mask = Mask.load(ref.path, record)
        self._masks[ref.path] = mask
        self._bytes += mask.nbytes
        while self._bytes > self.max_bytes and len(self._masks) > 1:
            self._bytes -= self._masks.popitem(last=False)[1].nbytes
        return mask

    def __len__(self) -> int:
        return len(self._masks)


class AffordanceReward:
    """Point answers against a mask, boxes or points; see the module docstring. Range [0, 1]."""

    def __init__(
        self,
        r_in: float = 10.0,
        r_out: float = 50.0,
        reference_diagonal: float = 800.0,
        mask_cache_mb: float = 512.0,
    ) -> None:
        if not 0 <= r_in < r_out:
            raise ValueError(f"affordance reward: need 0 <= r_in < r_out, got r_in={r_in}, r_out={r_out}")
        if reference_diagonal <= 0:
            raise ValueError(f"affordance reward: reference_diagonal must be > 0, got {reference_diagonal}")
        self.r_in, self.r_out, self.reference_diagonal = r_in, r_out, reference_diagonal
        self.masks = MaskCache(int(mask_cache_mb * 2**20))

    def radii(self, record: Record) -> tuple[float, float]:
        """(r_in, r_out) in this record's pixels."""
        scale = float(np.hypot(record.width, record.height)) / self.reference_diagonal
        return self.r_in * scale, self.r_out * scale

    def _score_one(self, points: np.ndarray, record: Record) -> tuple[float, float, float]:
        """(total, in_region, distance) for one answer's [P, 2] points."""
        r_in, r_out = self.radii(record)
        gt = record.ground_truth
        if isinstance(gt, MaskRef):
            inside, dist = self.masks.get(record, gt).lookup(points)
        elif isinstance(gt, Boxes):
            boxes = boxes_array(gt)
            inside, dist = points_in_boxes(points, boxes), distance_to_boxes(points, boxes)
        elif isinstance(gt, Points) and gt.points:
            dist = distance_to_points(points, np.asarray(gt.points, dtype=np.float64))
            inside = dist <= r_in
        else:
            raise ValueError(
                f"record {record.id}: affordance reward needs a mask, boxes or >= 1 point as "
                f"ground truth, got {gt!r:.80}"
            )
        in_region = float(inside.mean())
        distance = float(linear_shape(dist, r_in, r_out).mean())
        return (distance if isinstance(gt, Points) else in_region), in_region, distance

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        n = len(completions)
        indices, answers, failures = valid_answers("affordance", completions, records, "points")
        out = np.zeros((3, n))
        for i, answer in zip(indices, answers):
            out[:, i] = self._score_one(np.asarray(answer.points, dtype=np.float64), records[i])
        total, in_region, distance = out.tolist()
        return RewardResult(total, {"in_region": in_region, "distance": distance}, failures)
