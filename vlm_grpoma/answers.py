"""Typed model answers in ORIGINAL-image pixels, and the coordinate frames adapters convert through.

Contract: boxes ``[{"bbox_2d": [x1, y1, x2, y2], "label": ...}]``, points
``[{"point_2d": [x, y]}]``, trajectory ``[[x, y], ...]`` (>= 2 points), contact action
``{"point_2d": [x, y], "up": [ux, uy, uz], "forward": [fx, fy, fz]}``. Parsing never raises: it returns a
typed answer or a :class:`ParseError` value carrying a short machine-readable reason.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

XY = tuple[float, float]
Vec3 = tuple[float, float, float]
AnswerKind = Literal["boxes", "points", "trajectory", "contact_action", "text"]


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
class TextAnswer:
    """A short free-text answer (task ``answer``): the ``<answer>`` body, or the last ``\\boxed{}`` in it."""

    text: str


@dataclass(frozen=True)
class ParseError:
    """Why a text is not a valid answer; ``reason`` is a short key counted in the metrics."""

    reason: str
    detail: str = ""


Answer = Boxes | Points | Trajectory | ContactAction | TextAnswer
ANSWER_KINDS: dict[AnswerKind, type] = {
    "boxes": Boxes,
    "points": Points,
    "trajectory": Trajectory,
    "contact_action": ContactAction,
    "text": TextAnswer,
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
    if isinstance(answer, TextAnswer):
        return answer
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


# ---------------------------------------------------------------------------------------------------------
# Parsing and formatting. Parsing never raises on any string.

#: Caps so that a huge or adversarial answer cannot blow up memory or time.
MAX_BOXES = 100
MAX_POINTS = 1000
MAX_ANSWER_CHARS = 100_000
MAX_TEXT_CHARS = 1_000_000
#: Coordinates may overshoot the model-frame bounds by this many units (rounding at the image border).
BOUNDS_TOLERANCE = 1.0
#: Rewards skip answers with a coordinate beyond this magnitude (no image is that large, and squaring such
#: numbers in areas and distances could overflow).
MAX_COORDINATE = 1e7

_OPEN, _CLOSE = "<answer>", "</answer>"
_STRUCTURE_TAGS = ("<answer>", "</answer>", "<think>", "</think>")
#: Something after an unclosed ``<answer>`` that looks like a tag (``</think>``, ``<|im_end|>``, ...).
_TAG_LIKE = re.compile(r"</?\s*[A-Za-z|][^<>\n]{0,40}>")
_FENCE_OPEN = re.compile(r"```[A-Za-z0-9_-]*")


class _Invalid(Exception):
    """Internal: raised by the shape checkers, turned into a ParseError at the boundary."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _strip_fences(body: str) -> str:
    """Remove surrounding whitespace and a ```/```json code fence (closed or not)."""
    body = body.strip()
    if body.startswith("```"):  # plain string operations: linear time on any input
        body = body[_FENCE_OPEN.match(body).end() :].strip()
        if body.endswith("```"):
            body = body[:-3].strip()
    return body


def extract_answer(text: str) -> str | ParseError:
    """The content of the single ``<answer>…</answer>`` in ``text`` (fences and whitespace stripped).

    Text after the closing tag is ignored. A missing closing tag is accepted when it is unambiguous: one
    opening tag and nothing after it that looks like another tag.
    """
    n_open = text.count(_OPEN)
    if n_open == 0:
        return ParseError("no_answer_tag")
    if n_open > 1:
        return ParseError("multiple_answers", f"{n_open} {_OPEN} tags")
    start = text.index(_OPEN) + len(_OPEN)
    end = text.find(_CLOSE, start)
    if end >= 0:
        body = text[start:end]
    else:
        body = text[start:]
        tag = _TAG_LIKE.search(body)
        if tag:
            return ParseError("unclosed_answer", f"no {_CLOSE} and a tag follows: {tag.group(0)[:40]!r}")
    body = _strip_fences(body)
    return body if body else ParseError("empty_answer")


def _reject_constant(name: str) -> float:
    raise _Invalid("non_finite", f"JSON constant {name}")


def _number(value: object, where: str) -> float:
    """A finite JSON number, kept as int or float as written (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid("not_a_number", f"{where}: {str(value)[:40]!r}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if not finite:
        raise _Invalid("non_finite", where)
    return value


def _is_vector(value: object, n: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == n
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    )


def _vector(value: object, n: int, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != n:
        raise _Invalid("bad_shape", f"{where}: expected a list of {n} numbers")
    return tuple(_number(v, where) for v in value)


def _check_fields(item: dict, required: set[str], optional: set[str], where: str) -> None:
    missing = required - item.keys()
    if missing:
        raise _Invalid("missing_field", f"{where}: missing {', '.join(sorted(missing))}")
    unknown = item.keys() - required - optional
    if unknown:
        raise _Invalid("unknown_field", f"{where}: unknown {', '.join(sorted(unknown))[:80]}")


def _items(value: object, n_single: int, cap: int, what: str) -> list:
    """The list of items; a single item (a dict or a bare vector of ``n_single`` numbers) is one element."""
    if isinstance(value, dict) or _is_vector(value, n_single):
        return [value]
    if not isinstance(value, list):
        raise _Invalid("bad_shape", f"expected a list of {what}")
    if len(value) > cap:
        raise _Invalid(f"too_many_{what}", f"{len(value)} > {cap}")
    return value


def _xy(item: object, where: str) -> XY:
    """One point: ``{"point_2d": [x, y]}`` (optional label, dropped) or a bare ``[x, y]``."""
    if isinstance(item, dict):
        _check_fields(item, {"point_2d"}, {"label"}, where)
        item = item["point_2d"]
    x, y = _vector(item, 2, where)
    return (x, y)


def _box(item: object, where: str) -> Box:
    label = ""
    if isinstance(item, dict):
        _check_fields(item, {"bbox_2d"}, {"label"}, where)
        label = item.get("label", "")
        if not isinstance(label, str):
            raise _Invalid("bad_label", f"{where}: label must be a string")
        item = item["bbox_2d"]
    x1, y1, x2, y2 = _vector(item, 4, where)
    if x2 <= x1 or y2 <= y1:
        raise _Invalid("degenerate_box", f"{where}: [{x1}, {y1}, {x2}, {y2}]")
    return Box(x1, y1, x2, y2, label)


def _unit(value: object, where: str) -> Vec3:
    """A direction normalised to unit length; zero length is an error (scaled first so tiny values work)."""
    v = _vector(value, 3, where)
    peak = max(abs(c) for c in v)
    if peak == 0:
        raise _Invalid("zero_direction", where)
    scaled = [c / peak for c in v]
    norm = math.hypot(*scaled)
    return (scaled[0] / norm, scaled[1] / norm, scaled[2] / norm)


def _parse_boxes(value: object) -> Boxes:
    items = _items(value, 4, MAX_BOXES, "boxes")
    return Boxes(tuple(_box(item, f"box {i}") for i, item in enumerate(items)))


def _parse_points(value: object) -> Points:
    items = _items(value, 2, MAX_POINTS, "points")
    if not items:
        raise _Invalid("no_points")
    return Points(tuple(_xy(item, f"point {i}") for i, item in enumerate(items)))


def _parse_trajectory(value: object) -> Trajectory:
    if not isinstance(value, list):
        raise _Invalid("bad_shape", "expected a list of [x, y] points")
    if len(value) > MAX_POINTS:
        raise _Invalid("too_many_points", f"{len(value)} > {MAX_POINTS}")
    if len(value) < 2 or _is_vector(value, 2):
        raise _Invalid("too_few_points", "a trajectory needs at least 2 points")
    return Trajectory(tuple(_xy(item, f"point {i}") for i, item in enumerate(value)))


def _parse_contact_action(value: object) -> ContactAction:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict):
        raise _Invalid("bad_shape", 'expected {"point_2d": [x, y], "up": [...], "forward": [...]}')
    _check_fields(value, {"point_2d", "up", "forward"}, set(), "contact action")
    return ContactAction(
        _xy(value["point_2d"], "point_2d"), _unit(value["up"], "up"), _unit(value["forward"], "forward")
    )


_BOXED = "\\boxed"


def last_boxed_text(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept); None without a closed one."""
    start = text.rfind(_BOXED + "{")
    if start < 0:
        return None
    depth, begin = 0, start + len(_BOXED)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin + 1 : i].strip()
    return None


def _parse_text(body: str) -> TextAnswer:
    boxed = last_boxed_text(body) if _BOXED in body else body
    if boxed is None:
        raise _Invalid("unclosed_boxed", body[:40])
    if not boxed:
        raise _Invalid("empty_answer")
    return TextAnswer(boxed)


_PARSERS: dict[str, Callable[[object], Answer]] = {
    "boxes": _parse_boxes,
    "points": _parse_points,
    "trajectory": _parse_trajectory,
    "contact_action": _parse_contact_action,
    "text": _parse_text,
}


def image_xy(answer: Answer) -> list[XY]:
    """Every image coordinate of an answer (box corners, points, contact pixel)."""
    if isinstance(answer, Boxes):
        return [xy for b in answer.boxes for xy in ((b.x1, b.y1), (b.x2, b.y2))]
    if isinstance(answer, (Points, Trajectory)):
        return list(answer.points)
    if isinstance(answer, ContactAction):
        return [answer.point]
    if isinstance(answer, TextAnswer):
        return []
    raise TypeError(f"not an answer: {answer!r}")


def _check_bounds(answer: Answer, bounds: tuple[float, float]) -> None:
    width, height = bounds
    tol = BOUNDS_TOLERANCE
    for x, y in image_xy(answer):
        if not (-tol <= x <= width + tol and -tol <= y <= height + tol):
            raise _Invalid("out_of_bounds", f"({x}, {y}) outside {width} x {height}")


def parse_answer(
    text: str, kind: AnswerKind, bounds: tuple[float, float] | None = None
) -> Answer | ParseError:
    """Parse a whole completion (answer extracted first) or a bare JSON answer into a typed answer.

    ``bounds`` is the model-frame (width, height); coordinates beyond it by more than
    :data:`BOUNDS_TOLERANCE` are rejected. Returns a :class:`ParseError` for any malformed text; raises only
    for an unknown ``kind`` (a caller bug).
    """
    if kind not in _PARSERS:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of {', '.join(_PARSERS)}")
    if not isinstance(text, str):
        return ParseError("not_text", type(text).__name__)
    if len(text) > MAX_TEXT_CHARS:
        return ParseError("too_long", f"{len(text)} > {MAX_TEXT_CHARS} characters")
    if kind == "text" and _OPEN not in text and _BOXED in text:  # a bare \\boxed{} answers too
        body = text
    else:
        body = extract_answer(text) if any(t in text for t in _STRUCTURE_TAGS) else _strip_fences(text)
    if isinstance(body, ParseError):
        return body
    if not body:
        return ParseError("empty_answer")
    if len(body) > MAX_ANSWER_CHARS:
        return ParseError("too_long", f"{len(body)} > {MAX_ANSWER_CHARS} characters")
    try:
        value = body if kind == "text" else json.loads(body, parse_constant=_reject_constant)
        answer = _PARSERS[kind](value)
        if bounds is not None:
            _check_bounds(answer, bounds)
    except _Invalid as e:
        return ParseError(e.reason, e.detail)
    except RecursionError:
        return ParseError("invalid_json", "nested too deeply")
    except ValueError as e:  # json.JSONDecodeError, and ints beyond Python's digit limit
        return ParseError("invalid_json", str(e)[:200])
    return answer


def _json_number(v: float) -> float:
    """Plain int/float for JSON (numpy scalars included); ints stay ints so they print without '.0'."""
    return int(v) if isinstance(v, numbers.Integral) else float(v)


def _json_xy(xy: Sequence[float]) -> list[float]:
    return [_json_number(v) for v in xy]


def answer_to_json(answer: Answer) -> object:
    """The canonical JSON value of an answer (labels only when non-empty)."""
    if isinstance(answer, Boxes):
        return [
            {"bbox_2d": _json_xy((b.x1, b.y1, b.x2, b.y2)), **({"label": b.label} if b.label else {})}
            for b in answer.boxes
        ]
    if isinstance(answer, Points):
        return [{"point_2d": _json_xy(p)} for p in answer.points]
    if isinstance(answer, Trajectory):
        return [_json_xy(p) for p in answer.points]
    if isinstance(answer, ContactAction):
        return {
            "point_2d": _json_xy(answer.point),
            "up": _json_xy(answer.up),
            "forward": _json_xy(answer.forward),
        }
    if isinstance(answer, TextAnswer):
        return answer.text
    raise TypeError(f"not an answer: {answer!r}")


def format_answer(answer: Answer) -> str:
    """Canonical JSON text of an answer (SFT targets, round trips); non-finite numbers raise ValueError.

    A ``<`` can only occur inside a label string; it is written as ``\\u003c`` so that no label can look
    like a ``<answer>``/``</answer>`` tag once the text is wrapped in tags. A box that rounding has made
    degenerate (x1 == x2 or y1 == y2, which :func:`parse_answer` rejects) is widened to one unit towards the
    origin, or away from it at 0, so it stays inside a frame that contains the original box.
    """
    if isinstance(answer, TextAnswer):
        return answer.text.replace("<", "\\u003c")
    if isinstance(answer, Boxes):
        answer = Boxes(tuple(_one_unit_at_least(b) for b in answer.boxes))
    return json.dumps(answer_to_json(answer), ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def _one_unit_at_least(box: Box) -> Box:
    def widen(low: float, high: float) -> tuple[float, float]:
        if high > low:
            return low, high
        return (low - 1, low) if low >= 1 else (low, low + 1)

    (x1, x2), (y1, y2) = widen(box.x1, box.x2), widen(box.y1, box.y2)
    return replace(box, x1=x1, y1=y1, x2=x2, y2=y2)


def answers_of_kind(
    answers: Sequence[Answer | ParseError], kind: AnswerKind
) -> tuple[list[int], list[Answer], dict[str, int]]:
    """Indices and answers of the given kind, plus the count of each failure reason among the others.

    Rewards use it to score only valid answers; a typed answer of another kind counts as ``wrong_kind``, one
    with a non-finite coordinate or one beyond :data:`MAX_COORDINATE` as ``coordinate_range``.
    """
    expected = ANSWER_KINDS[kind]
    indices: list[int] = []
    valid: list[Answer] = []
    failures: Counter[str] = Counter()
    for i, answer in enumerate(answers):
        if isinstance(answer, ParseError):
            failures[answer.reason] += 1
        elif not isinstance(answer, expected):
            failures["wrong_kind"] += 1
        elif not all(abs(v) <= MAX_COORDINATE for xy in image_xy(answer) for v in xy):
            failures["coordinate_range"] += 1
        else:
            indices.append(i)
            valid.append(answer)
    return indices, valid, dict(failures)
