"""Typed model answers in ORIGINAL-image pixels, and the coordinate frames adapters convert through.

Contract (DESIGN.md §3 Answers): boxes ``[{"bbox_2d": [x1, y1, x2, y2], "label": ...}]``, points
``[{"point_2d": [x, y]}]``, trajectory ``[[x, y], ...]`` (>= 2 points), contact action
``{"point_2d": [x, y], "up": [ux, uy, uz], "forward": [fx, fy, fz]}``. Parsing never raises: it returns a
typed answer or a :class:`ParseError` value carrying a short machine-readable reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Union

XY = tuple[float, float]
Vec3 = tuple[float, float, float]
AnswerKind = Literal["boxes", "points", "trajectory", "contact_action"]


@dataclass(frozen=True)
class Box:
    x1: float
    y1: float
    x2: float
    y2: float
    label: str = ""


@dataclass(frozen=True)
class Boxes:
    boxes: tuple[Box, ...]


@dataclass(frozen=True)
class Points:
    points: tuple[XY, ...]


@dataclass(frozen=True)
class Trajectory:
    points: tuple[XY, ...]


@dataclass(frozen=True)
class ContactAction:
    """Contact pixel plus gripper up/forward unit directions in the camera frame (ManipLLM convention)."""

    point: XY
    up: Vec3
    forward: Vec3


@dataclass(frozen=True)
class ParseError:
    """Why a text is not a valid answer; ``reason`` is a short key counted in the metrics."""

    reason: str
    detail: str = ""


Answer = Union[Boxes, Points, Trajectory, ContactAction]
ANSWER_KINDS: dict[AnswerKind, type] = {
    "boxes": Boxes,
    "points": Points,
    "trajectory": Trajectory,
    "contact_action": ContactAction,
}


def map_xy(answer: Answer, fn: Callable[[float, float], XY]) -> Answer:
    """Apply a point mapping to every image coordinate of an answer (directions are left alone)."""
    if isinstance(answer, Boxes):
        boxes = []
        for b in answer.boxes:
            x1, y1 = fn(b.x1, b.y1)
            x2, y2 = fn(b.x2, b.y2)
            boxes.append(replace(b, x1=x1, y1=y1, x2=x2, y2=y2))
        return Boxes(tuple(boxes))
    if isinstance(answer, (Points, Trajectory)):
        return type(answer)(tuple(fn(x, y) for x, y in answer.points))
    if isinstance(answer, ContactAction):
        return replace(answer, point=fn(*answer.point))
    raise TypeError(f"not an answer: {answer!r}")


@dataclass(frozen=True)
class CoordinateFrame:
    """A linear map between a model's coordinate frame and original-image pixels.

    ``model = pixel * scale``: Qwen2-VL / Qwen3-VL use integers in [0, 1000] (scale = 1000 / size);
    Qwen2.5-VL uses absolute pixels of the resized image the processor sees (scale = resized / original).
    """

    width: int
    height: int
    model_width: float
    model_height: float

    @classmethod
    def normalised(cls, width: int, height: int, extent: float = 1000.0) -> CoordinateFrame:
        return cls(width, height, extent, extent)

    @classmethod
    def resized(cls, width: int, height: int, resized_width: int, resized_height: int) -> CoordinateFrame:
        return cls(width, height, float(resized_width), float(resized_height))

    def to_pixels(self, answer: Answer) -> Answer:
        sx, sy = self.width / self.model_width, self.height / self.model_height
        return map_xy(answer, lambda x, y: (x * sx, y * sy))

    def from_pixels(self, answer: Answer) -> Answer:
        sx, sy = self.model_width / self.width, self.model_height / self.height
        return map_xy(answer, lambda x, y: (x * sx, y * sy))
