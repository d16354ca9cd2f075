"""The ``Record``: one training/eval example, ground truth always in ORIGINAL-image pixels.

On disk a record is one JSON object per line (JSONL)::

    {"id": "shapes-000017", "image": "images/000017.png", "task": "detection",
     "prompt": "the large red triangle", "width": 224, "height": 224, "split": "train",
     "ground_truth": {"boxes": [{"bbox_2d": [12, 30, 80, 95], "label": "red triangle"}]},
     "meta": {...}}

``image`` (and a mask path) are relative to the JSONL file's folder unless absolute. Ground truth is one
of ``{"boxes": [...]}``, ``{"points": [[x, y], ...]}``, ``{"trajectory": [[x, y], ...]}``,
``{"mask": "masks/x.png"}`` (non-zero pixels are the target region), or ``{"contact_action": {...}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from vlm_grpoma.answers import AnswerKind, Box, Boxes, ContactAction, Points, Trajectory

Task = Literal["detection", "affordance", "trajectory", "manipulation"]
TASKS: tuple[str, ...] = ("detection", "affordance", "trajectory", "manipulation")
#: The answer type a model must produce for each task.
ANSWER_KIND_OF_TASK: dict[str, AnswerKind] = {
    "detection": "boxes",
    "affordance": "points",
    "trajectory": "trajectory",
    "manipulation": "contact_action",
}


@dataclass(frozen=True)
class MaskRef:
    """A binary target region stored as an image file (non-zero = inside)."""

    path: str


GroundTruth = Boxes | Points | Trajectory | ContactAction | MaskRef


@dataclass(frozen=True)
class Record:
    id: str
    image: str
    task: Task
    prompt: str
    width: int
    height: int
    ground_truth: GroundTruth
    split: str = "train"
    meta: dict[str, Any] = field(default_factory=dict)


def ground_truth_to_json(gt: GroundTruth) -> dict[str, Any]:
    """Serialise ground truth in the on-disk form documented above."""
    if isinstance(gt, Boxes):
        return {"boxes": [{"bbox_2d": [b.x1, b.y1, b.x2, b.y2], "label": b.label} for b in gt.boxes]}
    if isinstance(gt, Points):
        return {"points": [list(p) for p in gt.points]}
    if isinstance(gt, Trajectory):
        return {"trajectory": [list(p) for p in gt.points]}
    if isinstance(gt, MaskRef):
        return {"mask": gt.path}
    if isinstance(gt, ContactAction):
        return {
            "contact_action": {"point_2d": list(gt.point), "up": list(gt.up), "forward": list(gt.forward)}
        }
    raise TypeError(f"not a ground truth: {gt!r}")


def record_to_json(record: Record) -> dict[str, Any]:
    return {
        "id": record.id,
        "image": record.image,
        "task": record.task,
        "prompt": record.prompt,
        "width": record.width,
        "height": record.height,
        "split": record.split,
        "ground_truth": ground_truth_to_json(record.ground_truth),
        "meta": record.meta,
    }


__all__ = [
    "ANSWER_KIND_OF_TASK",
    "TASKS",
    "Box",
    "GroundTruth",
    "MaskRef",
    "Record",
    "Task",
    "ground_truth_to_json",
    "record_to_json",
]
