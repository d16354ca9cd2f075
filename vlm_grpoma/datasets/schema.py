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

A prompt with several images (a front and a wrist camera, the last frames before an action) lists them in
prompt order as ``"images": ["front.png", "wrist.png"]`` instead of ``image``, and ``"target_image": 1`` names
the one whose pixels the ground truth and the answers use (default 0); ``width``/``height`` are that image's.
In memory ``image`` is always the target image, so everything that maps coordinates reads it alone, and
``images`` holds every image when there are several (``()`` for one image or none).

A short video (the frames before the action) is ``"video": {"frames": ["f0.png", "f1.png", ...], "fps": 2}``
(at least 2 frames of one size) or ``"video": {"path": "clip.mp4", "fps": 2}`` (a video file, sampled at
``fps`` frames a second), shown before the images. It is context only: a task with coordinates still
needs an image for them, an ``answer`` record may have the video alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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

#: Qwen-VL's temporal patch: a video is cut into pairs of frames, so it needs at least this many.
MIN_VIDEO_FRAMES = 2
#: Frames per second a video is said to be sampled at when its record gives none (qwen-vl-utils' FPS).
DEFAULT_VIDEO_FPS = 2.0


@dataclass(frozen=True)
class Video:
    """A video as its sampled frames (image files of one size, in time order) or a video file (``path``), and
    the rate the frames were, or are to be, sampled at."""

    frames: tuple[str, ...] = ()
    fps: float = DEFAULT_VIDEO_FPS
    path: str = ""

    def __post_init__(self) -> None:
        if bool(self.frames) == bool(self.path):
            raise ValueError("a video is its frames or a video file (path), one of the two")


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
    #: every image of the prompt in order when there are several, else empty (``image`` alone)
    images: tuple[str, ...] = ()
    #: index into ``images`` of the image the ground truth and the answers are in
    target_image: int = 0
    #: a video shown before the images (context), or None
    video: Video | None = None

    def __post_init__(self) -> None:
        if not self.images:
            if self.target_image != 0:
                raise ValueError(f"record {self.id}: target_image {self.target_image} without images")
            return
        if len(self.images) < 2:
            raise ValueError(f"record {self.id}: one image is given as image, not images")
        if not 0 <= self.target_image < len(self.images):
            raise ValueError(
                f"record {self.id}: target_image {self.target_image} is not an index of its "
                f"{len(self.images)} images"
            )
        if self.image != self.images[self.target_image]:
            raise ValueError(f"record {self.id}: image must be images[target_image]")

    @property
    def text_only(self) -> bool:
        """No image and no video: the prompt is the whole input (an ``answer`` record may have neither)."""
        return self.image is None and self.video is None

    @property
    def prompt_images(self) -> tuple[str, ...]:
        """Every image the prompt shows, in order: ``images``, or the one ``image``, or none."""
        return self.images or (() if self.image is None else (self.image,))


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


def with_images(record: Record, images: tuple[str, ...], target_image: int = 0) -> Record:
    """``record`` showing ``images`` (one or several; the ground truth stays in ``images[target_image]``)."""
    if len(images) == 1:
        return replace(record, image=images[0], images=(), target_image=0)
    return replace(record, image=images[target_image], images=tuple(images), target_image=target_image)


def record_to_json(record: Record) -> dict[str, Any]:
    """The on-disk JSON object; a text-only record has no ``image``/``width``/``height`` keys, a record with
    several images has ``images`` (and ``target_image`` when it is not the first) instead of ``image``."""
    if record.images:
        target = {"target_image": record.target_image} if record.target_image else {}
        image: dict[str, Any] = {"images": list(record.images), **target}
    else:
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
        **({} if record.video is None else {"video": video_to_json(record.video)}),
    }


def video_to_json(video: Video) -> dict[str, Any]:
    source = {"path": video.path} if video.path else {"frames": list(video.frames)}
    return {**source, "fps": video.fps}


__all__ = [
    "ANSWER_KIND_OF_TASK",
    "DEFAULT_VIDEO_FPS",
    "MATCHERS",
    "MIN_VIDEO_FRAMES",
    "TASKS",
    "TEXT_TASKS",
    "Box",
    "GroundTruth",
    "MaskRef",
    "Record",
    "ShortAnswer",
    "Task",
    "Video",
    "ground_truth_to_json",
    "record_to_json",
    "video_to_json",
    "with_images",
]
