"""The ``Record``: one training/eval example, ground truth always in ORIGINAL-image pixels.

On disk a record is one JSON object per line (JSONL)::

    {"id": "shapes-000017", "image": "images/000017.png", "task": "detection",
     "prompt": "the large red triangle", "width": 224, "height": 224, "split": "train",
     "ground_truth": {"boxes": [{"bbox_2d": [12, 30, 80, 95], "label": "red triangle"}]},
     "meta": {...}}

``image`` (and a mask path) are relative to the JSONL file's folder unless absolute. Ground truth is one
of ``{"boxes": [...]}``, ``{"points": [[x, y], ...]}``, ``{"trajectory": [[x, y], ...]}``,
``{"mask": "masks/x.png"}`` (non-zero pixels are the target region), ``{"contact_action": {...}}``, or for
task ``answer`` a short text answer ``{"answer": "55", "matcher": "numeric", "tolerance": 0.0}`` (matcher and
tolerance optional). ``image``/``width``/``height`` are optional for ``answer`` records (None = text-only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from vlm_grpoma.answers import AnswerKind, Box, Boxes, ContactAction, Points, Trajectory

Task = Literal["detection", "affordance", "trajectory", "manipulation", "answer"]
TASKS: tuple[str, ...] = ("detection", "affordance", "trajectory", "manipulation", "answer")
#: Tasks whose records may be text-only (no image, width or height).
TEXT_TASKS: tuple[str, ...] = ("answer",)
Matcher = Literal["exact", "numeric", "choice"]
MATCHERS: tuple[str, ...] = ("exact", "numeric", "choice")
#: The answer type a model must produce for each task.
ANSWER_KIND_OF_TASK: dict[str, AnswerKind] = {
    "detection": "boxes",
    "affordance": "points",
    "trajectory": "trajectory",
    "manipulation": "contact_action",
    "answer": "text",
}


@dataclass(frozen=True)
class MaskRef:
    """A binary target region stored as an image file (non-zero = inside)."""

    path: str


@dataclass(frozen=True)
class ShortAnswer:
    """A verifiable text answer; ``matcher=None`` means the ``answer_match`` reward's default matcher."""

    answer: str
    matcher: Matcher | None = None
    tolerance: float | None = None


GroundTruth = Boxes | Points | Trajectory | ContactAction | MaskRef | ShortAnswer


@dataclass(frozen=True)
class Record:
    id: str
    image: str | None
    task: Task
    prompt: str
    width: int | None
    height: int | None
    ground_truth: GroundTruth
    split: str = "train"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text_only(self) -> bool:
        """No image: the prompt is the whole input (an ``answer`` record may have none)."""
        return self.image is None


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
    if isinstance(gt, ShortAnswer):
        out: dict[str, Any] = {"answer": gt.answer}
        if gt.matcher is not None:
            out["matcher"] = gt.matcher
        if gt.tolerance is not None:
            out["tolerance"] = gt.tolerance
        return out
    if isinstance(gt, ContactAction):
        return {
            "contact_action": {"point_2d": list(gt.point), "up": list(gt.up), "forward": list(gt.forward)}
        }
    raise TypeError(f"not a ground truth: {gt!r}")


def record_to_json(record: Record) -> dict[str, Any]:
    """The on-disk JSON object; a text-only record has no ``image``/``width``/``height`` keys."""
    image = {} if record.image is None else {"image": record.image}
    size = {} if record.width is None else {"width": record.width, "height": record.height}
    return {
        "id": record.id,
        **image,
        "task": record.task,
        "prompt": record.prompt,
        **size,
        "split": record.split,
        "ground_truth": ground_truth_to_json(record.ground_truth),
        "meta": record.meta,
    }


__all__ = [
    "ANSWER_KIND_OF_TASK",
    "MATCHERS",
    "TASKS",
    "TEXT_TASKS",
    "Box",
    "GroundTruth",
    "MaskRef",
    "Record",
    "ShortAnswer",
    "Task",
    "ground_truth_to_json",
    "record_to_json",
]
