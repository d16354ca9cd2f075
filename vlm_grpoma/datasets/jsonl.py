"""Read and write :class:`Record` JSONL files, validating every line.

Each bad line raises a :class:`RecordError` naming the file, line, record id and field, e.g.
``data/train.jsonl:17 (id shapes-000016): ground_truth.boxes[0].bbox_2d: x2 (10) must be > x1 (40)``.
Relative ``image`` / ``mask`` paths are resolved against the JSONL file's folder when read, so in-memory
records hold usable paths; :func:`write_records` makes them relative to the output folder again.

Hostile input is bounded: a line nested deeper than :data:`MAX_JSON_DEPTH` or holding an integer longer than
:data:`MAX_INT_DIGITS` digits is a bad line (not a ``RecursionError`` or a quadratic conversion), so is a
string holding a lone surrogate escape (``"\\ud800"``: JSON allows it, but it is no text and cannot be written as
UTF-8 to ``samples.jsonl`` or ``predictions.jsonl`` later), and ``read_records(check_images=True)`` checks
every image up front (see ``images.image_problems``). A records path that is not a regular file (a FIFO) is
refused without opening it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from vlm_grpoma.answers import Box, Boxes, ContactAction, Points, Trajectory
from vlm_grpoma.datasets.images import image_problems
from vlm_grpoma.datasets.schema import (
    DEFAULT_VIDEO_FPS,
    MATCHERS,
    MIN_VIDEO_FRAMES,
    TASKS,
    TEXT_TASKS,
    GroundTruth,
    MaskRef,
    Record,
    ShortAnswer,
    Video,
    record_to_json,
    with_images,
)
from vlm_grpoma.errors import DataError

log = logging.getLogger(__name__)

#: Ground-truth kinds each task accepts (affordance: a region as a mask, boxes or points).
GROUND_TRUTH_OF_TASK: dict[str, tuple[str, ...]] = {
    "detection": ("boxes",),
    "affordance": ("mask", "boxes", "points"),
    "trajectory": ("trajectory",),
    "manipulation": ("contact_action",),
    "answer": ("answer",),
}
_REQUIRED = ("id", "task", "prompt", "ground_truth")
_IMAGE_FIELDS = ("image", "width", "height")
_OPTIONAL = ("split", "meta", "images", "target_image", "video")
#: Deepest nesting of arrays/objects accepted in a JSON value (a record needs 5 levels).
MAX_JSON_DEPTH = 64
#: Longest record line read, in characters (a record with its meta is a few KB; 16 Mi leaves room for much more).
MAX_LINE_CHARS = 16 << 20
#: Longest integer literal accepted (Python refuses 4300+ digits, and converts long ones in quadratic time).
MAX_INT_DIGITS = 64


class RecordError(DataError):
    """A record line that is not valid; the message names file:line, record id and field."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


class JSONLimitError(ValueError):
    """JSON text that parses but exceeds :data:`MAX_JSON_DEPTH` or :data:`MAX_INT_DIGITS`."""


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONLimitError(f"an integer of {len(digits.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(digits)


def _depth(value: Any) -> int:
    """Nesting depth of arrays/objects in ``value``, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads_bounded(text: str) -> Any:
    """``json.loads`` for untrusted text: :class:`JSONLimitError` beyond the depth and integer-size limits,
    ``json.JSONDecodeError`` for malformed text."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise JSONLimitError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (JSONLimitError, json.JSONDecodeError):
        raise
    except ValueError as err:  # e.g. a float literal Python cannot convert
        raise JSONLimitError(str(err)[:200]) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise JSONLimitError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _printable(text: str) -> str:
    """``text`` with any lone surrogate written as its escape (``\\ud800``), so an error message can be printed."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _lone_surrogate(obj: Any) -> str | None:
    """The dotted name of the first key or string of a decoded record holding a lone surrogate, else None."""
    stack = [(obj, "")]
    while stack:
        node, name = stack.pop()
        if isinstance(node, str):
            if _printable(node) != node:
                return name
        elif isinstance(node, dict):
            for key, value in reversed(node.items()):
                child = f"{name}.{_printable(key)}" if name else _printable(key)
                stack += [(value, child), (key, f"{child} (its key)")]
        elif isinstance(node, list):
            stack.extend((value, f"{name}[{i}]") for i, value in reversed(list(enumerate(node))))
    return None


class _FieldError(ValueError):
    """A problem with one field, before the file/line/id context is known."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")


@dataclass
class LoadReport:
    """What :func:`load_records` read: the valid records (with their line numbers) and one error per skipped
    line, in file order."""

    path: Path
    records: list[Record] = field(default_factory=list)
    errors: list[RecordError] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.errors)


# ---------------------------------------------------------------------------------------------- parsing


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _FieldError(name, f"must be a number, got {json.dumps(value)}")
    if not math.isfinite(value):
        raise _FieldError(name, f"must be finite, got {value}")
    return value


def _xy(value: Any, name: str, width: int, height: int) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise _FieldError(name, f"must be a list [x, y], got {json.dumps(value)}")
    x, y = _number(value[0], f"{name}[0]"), _number(value[1], f"{name}[1]")
    if not (0 <= x <= width and 0 <= y <= height):
        raise _FieldError(name, f"point ({x}, {y}) is outside the image [0, {width}] x [0, {height}]")
    return (x, y)


def _nonempty_list(value: Any, name: str, min_len: int = 1) -> list:
    if not isinstance(value, list):
        raise _FieldError(name, f"must be a list, got {json.dumps(value)}")
    if len(value) < min_len:
        raise _FieldError(name, f"needs at least {min_len} item(s), got {len(value)}")
    return value


def _box(value: Any, name: str, width: int, height: int) -> Box:
    if not isinstance(value, dict):
        raise _FieldError(name, 'must be an object {"bbox_2d": [x1, y1, x2, y2], "label": ...}')
    unknown = sorted(set(value) - {"bbox_2d", "label"})
    if unknown:
        raise _FieldError(name, f"unknown key(s) {unknown}")
    coords = value.get("bbox_2d")
    if not isinstance(coords, list) or len(coords) != 4:
        raise _FieldError(f"{name}.bbox_2d", f"must be a list [x1, y1, x2, y2], got {json.dumps(coords)}")
    x1, y1, x2, y2 = (_number(c, f"{name}.bbox_2d[{i}]") for i, c in enumerate(coords))
    if x2 <= x1:
        raise _FieldError(f"{name}.bbox_2d", f"x2 ({x2}) must be > x1 ({x1})")
    if y2 <= y1:
        raise _FieldError(f"{name}.bbox_2d", f"y2 ({y2}) must be > y1 ({y1})")
    if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
        raise _FieldError(
            f"{name}.bbox_2d", f"box {coords} is outside the image [0, {width}] x [0, {height}]"
        )
    label = value.get("label", "")
    if not isinstance(label, str):
        raise _FieldError(f"{name}.label", f"must be a string, got {json.dumps(label)}")
    return Box(x1, y1, x2, y2, label)


def _vec3(value: Any, name: str) -> tuple[float, float, float]:
    if not isinstance(value, list) or len(value) != 3:
        raise _FieldError(name, f"must be a list [x, y, z], got {json.dumps(value)}")
    vec = tuple(_number(c, f"{name}[{i}]") for i, c in enumerate(value))
    if math.hypot(*vec) < 1e-6:
        raise _FieldError(name, "must be a non-zero direction")
    return vec  # type: ignore[return-value]


def _resolve(path: str, base_dir: Path) -> str:
    """An absolute, normalised path: relative ones are taken relative to ``base_dir``."""
    return os.path.normpath(os.path.join(base_dir, path))


def _short_answer(value: dict) -> ShortAnswer:
    """``{"answer": "55", "matcher": "numeric", "tolerance": 0.01}``, matcher and tolerance optional."""
    unknown = sorted(set(value) - {"answer", "matcher", "tolerance"})
    if unknown:
        raise _FieldError(f"ground_truth.{unknown[0]}", 'unknown key (use "answer", "matcher", "tolerance")')
    answer = value.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        raise _FieldError("ground_truth.answer", f"must be a non-empty string, got {json.dumps(answer)}")
    matcher = value.get("matcher")
    if matcher is not None and matcher not in MATCHERS:
        raise _FieldError(
            "ground_truth.matcher", f"must be one of {list(MATCHERS)}, got {json.dumps(matcher)}"
        )
    tolerance = value.get("tolerance")
    if tolerance is not None:
        tolerance = _number(tolerance, "ground_truth.tolerance")
        if tolerance < 0:
            raise _FieldError("ground_truth.tolerance", f"must be >= 0, got {json.dumps(tolerance)}")
    return ShortAnswer(answer, matcher, tolerance)


def parse_ground_truth(
    value: Any, task: str, width: int | None, height: int | None, base_dir: Path
) -> GroundTruth:
    """Typed ground truth from its JSON form, checked against the task and the image bounds."""
    if not isinstance(value, dict):
        raise _FieldError("ground_truth", f"must be an object, got {json.dumps(value)}")
    if task == "answer":
        return _short_answer(value)
    allowed = GROUND_TRUTH_OF_TASK[task]
    if len(value) != 1:
        raise _FieldError(
            "ground_truth", f"must have exactly one key of {list(allowed)}, got {sorted(value)}"
        )
    ((kind, body),) = value.items()
    if kind not in allowed:
        raise _FieldError("ground_truth", f"task {task!r} takes {' or '.join(allowed)}, not {kind!r}")
    name = f"ground_truth.{kind}"
    if kind == "boxes":
        items = _nonempty_list(body, name)
        return Boxes(tuple(_box(b, f"{name}[{i}]", width, height) for i, b in enumerate(items)))
    if kind == "points":
        items = _nonempty_list(body, name)
        return Points(tuple(_xy(p, f"{name}[{i}]", width, height) for i, p in enumerate(items)))
    if kind == "trajectory":
        items = _nonempty_list(body, name, min_len=2)
        return Trajectory(tuple(_xy(p, f"{name}[{i}]", width, height) for i, p in enumerate(items)))
    if kind == "mask":
        if not isinstance(body, str) or not body:
            raise _FieldError(name, f"must be a non-empty path string, got {json.dumps(body)}")
        return MaskRef(_resolve(body, base_dir))
    # contact_action (the only kind left in GROUND_TRUTH_OF_TASK)
    if not isinstance(body, dict) or set(body) != {"point_2d", "up", "forward"}:
        raise _FieldError(name, 'must be an object with exactly "point_2d", "up" and "forward"')
    return ContactAction(
        point=_xy(body["point_2d"], f"{name}.point_2d", width, height),
        up=_vec3(body["up"], f"{name}.up"),
        forward=_vec3(body["forward"], f"{name}.forward"),
    )


def _image_paths(obj: dict, base_dir: Path) -> tuple[str, ...]:
    """The record's images in prompt order, resolved: ``image``, or the list ``images``, or none."""
    if "image" in obj and "images" in obj:
        raise _FieldError("images", "give image (one) or images (several), not both")
    if "target_image" in obj and "images" not in obj:
        raise _FieldError("target_image", "names one of images; a record with image has only that one")
    if "image" in obj:
        paths = [obj["image"]]
        names = ["image"]
    elif "images" in obj:
        paths = _nonempty_list(obj["images"], "images")
        names = [f"images[{i}]" for i in range(len(paths))]
    else:
        return ()
    for name, value in zip(names, paths):
        if not isinstance(value, str) or not value.strip():
            raise _FieldError(name, f"must be a non-empty path string, got {json.dumps(value)}")
    return tuple(_resolve(p, base_dir) for p in paths)


def _video(value: Any, base_dir: Path) -> Video:
    """``{"frames": [paths], "fps": 2}`` (at least :data:`MIN_VIDEO_FRAMES` frames) or ``{"path": file,
    "fps": 2}``, with a positive finite rate."""
    if not isinstance(value, dict):
        raise _FieldError(
            "video",
            f'must be an object {{"frames": [...] or "path": ..., "fps": ...}}, got {json.dumps(value)}',
        )
    unknown = sorted(set(value) - {"frames", "path", "fps"})
    if unknown:
        raise _FieldError(f"video.{unknown[0]}", 'unknown key (use "frames" or "path", and "fps")')
    if ("frames" in value) == ("path" in value):
        raise _FieldError("video", 'give "frames" (image files) or "path" (a video file), one of the two')
    fps = _number(value.get("fps", DEFAULT_VIDEO_FPS), "video.fps")
    if fps <= 0:
        raise _FieldError("video.fps", f"must be > 0, got {json.dumps(value['fps'])}")
    if "path" in value:
        if not isinstance(value["path"], str) or not value["path"].strip():
            raise _FieldError(
                "video.path", f"must be a non-empty path string, got {json.dumps(value['path'])}"
            )
        return Video(fps=float(fps), path=_resolve(value["path"], base_dir))
    frames = value["frames"]
    if not isinstance(frames, list):
        raise _FieldError("video.frames", f"must be a list of frame image paths, got {json.dumps(frames)}")
    if len(frames) < MIN_VIDEO_FRAMES:
        raise _FieldError(
            "video.frames",
            f"a video needs at least {MIN_VIDEO_FRAMES} frames (Qwen-VL encodes frames in pairs), got "
            f"{len(frames)}; give a single frame as an image",
        )
    for i, frame in enumerate(frames):
        if not isinstance(frame, str) or not frame.strip():
            raise _FieldError(
                f"video.frames[{i}]", f"must be a non-empty path string, got {json.dumps(frame)}"
            )
    return Video(tuple(_resolve(f, base_dir) for f in frames), float(fps))


def _target_image(obj: dict, count: int) -> int:
    value = obj.get("target_image", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise _FieldError(
            "target_image", f"must be an index of images, 0 to {count - 1}, got {json.dumps(value)}"
        )
    return value


def record_from_json(obj: Any, base_dir: Path) -> Record:
    """A validated :class:`Record` from one decoded JSON line; raises ``_FieldError`` (a ValueError)."""
    if not isinstance(obj, dict):
        raise _FieldError("record", f"must be a JSON object, got {type(obj).__name__}")
    surrogate = _lone_surrogate(obj)
    if surrogate is not None:
        raise _FieldError(surrogate, "holds a lone surrogate escape (\\ud800-\\udfff alone is not text)")
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise _FieldError(missing[0], "required field is missing")
    unknown = sorted(set(obj) - set(_REQUIRED) - set(_IMAGE_FIELDS) - set(_OPTIONAL))
    if unknown:
        raise _FieldError(unknown[0], "unknown field (put extra information under 'meta')")
    if obj["task"] not in TASKS:
        raise _FieldError("task", f"must be one of {list(TASKS)}, got {json.dumps(obj['task'])}")
    images = _image_paths(obj, base_dir)
    target = _target_image(obj, len(images)) if "images" in obj else 0
    video = _video(obj["video"], base_dir) if "video" in obj else None
    has_image = bool(images)
    if video is not None and not has_image and obj["task"] not in TEXT_TASKS:
        raise _FieldError(
            "video",
            f"a {obj['task']} record needs an image for its coordinates (image or images); the video is context",
        )
    if has_image or obj["task"] not in TEXT_TASKS:
        missing = [k for k in _IMAGE_FIELDS if k not in obj and not (k == "image" and has_image)]
        if missing:
            raise _FieldError(missing[0], "required field is missing")
    elif "width" in obj or "height" in obj:
        raise _FieldError(
            "width" if "width" in obj else "height", "a text-only record (no image) has no size"
        )
    for key in ("id", "prompt", "split"):
        value = obj.get(key, "train")
        if not isinstance(value, str) or not value.strip():
            raise _FieldError(key, f"must be a non-empty string, got {json.dumps(value)}")
    for key in ("width", "height") if has_image else ():
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _FieldError(key, f"must be a positive integer, got {json.dumps(value)}")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise _FieldError("meta", f"must be an object, got {json.dumps(meta)}")
    gt = parse_ground_truth(obj["ground_truth"], obj["task"], obj.get("width"), obj.get("height"), base_dir)
    record = Record(
        id=obj["id"],
        image=None,
        task=obj["task"],
        prompt=obj["prompt"],
        width=obj.get("width"),
        height=obj.get("height"),
        ground_truth=gt,
        split=obj.get("split", "train"),
        meta=meta,
        video=video,
    )
    return with_images(record, images, target) if images else record


# ---------------------------------------------------------------------------------------------- reading


def _where(path: Path | str, line_no: int, obj: Any) -> str:
    rid = obj.get("id") if isinstance(obj, dict) else None
    return f"{path}:{line_no}" + (f" (id {_printable(rid)})" if isinstance(rid, str) and rid else "")


def first_record_task(path: str | Path) -> str | None:
    """The ``task`` of the first record in ``path``, cheaply (one line read), for a hint before the records are
    loaded; None when it cannot be read (loading the records then says why, naming the line)."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    task = loads_bounded(line).get("task")
                    return task if isinstance(task, str) else None
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return None
    return None


def _lines(handle: TextIO) -> Iterator[tuple[int, str | None]]:
    """``(line number, text)`` of every line, read one at a time; None for a line longer than
    :data:`MAX_LINE_CHARS` (skipped without being held). Split at newlines only: U+2028 may sit in a string."""
    line_no = 0
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        line_no += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := handle.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
            yield line_no, None
        else:
            yield line_no, line


def load_records(path: str | Path) -> LoadReport:
    """Read every line of ``path``; valid records and the error of each bad line, in file order."""
    path = Path(path)
    report = LoadReport(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # reading a FIFO would block forever
            raise RecordError(f"{path}: records file is not a regular file")
        with open(path, encoding="utf-8-sig") as handle:
            _read_into(report, _lines(handle))
    except FileNotFoundError:
        raise RecordError(f"{path}: records file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"{path}: cannot read records file: {err}") from None
    return report


def _read_into(report: LoadReport, lines: Iterator[tuple[int, str | None]]) -> None:
    """Parse ``lines`` of ``report.path`` into its records and errors."""
    path = report.path
    base_dir = Path(os.path.abspath(path.parent))
    first_line_of_id: dict[str, int] = {}
    for line_no, line in lines:
        if line is None:
            report.errors.append(
                RecordError(f"{path}:{line_no}: longer than {MAX_LINE_CHARS} characters; not read", line_no)
            )
            continue
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            obj = loads_bounded(line)
        except json.JSONDecodeError as err:
            report.errors.append(
                RecordError(f"{path}:{line_no}: invalid JSON: {err.msg} at column {err.colno}", line_no)
            )
            continue
        except JSONLimitError as err:
            report.errors.append(RecordError(f"{path}:{line_no}: refused JSON: {err}", line_no))
            continue
        where = _where(path, line_no, obj)
        try:
            record = record_from_json(obj, base_dir)
        except ValueError as err:
            report.errors.append(RecordError(f"{where}: {err}", line_no))
            continue
        if record.id in first_line_of_id:
            report.errors.append(
                RecordError(
                    f"{where}: id: duplicate id, first used on line {first_line_of_id[record.id]}", line_no
                )
            )
            continue
        first_line_of_id[record.id] = line_no
        report.records.append(record)
        report.lines.append(line_no)


def drop_bad_images(report: LoadReport) -> LoadReport:
    """Move the records whose image or mask fails :func:`~vlm_grpoma.datasets.images.image_problems` from
    ``report.records`` to ``report.errors`` (kept in file order)."""
    problems = image_problems(report.records, cache_key=os.path.abspath(report.path))
    if not problems:
        return report
    kept = LoadReport(report.path, errors=list(report.errors))
    for index, (record, line_no) in enumerate(zip(report.records, report.lines)):
        if index in problems:
            kept.errors.append(
                RecordError(f"{report.path}:{line_no} (id {record.id}): {problems[index]}", line_no)
            )
        else:
            kept.records.append(record)
            kept.lines.append(line_no)
    kept.errors.sort(key=lambda err: err.line)
    return kept


def outside_root(report: LoadReport, root: str | Path) -> LoadReport:
    """Move the records whose image or mask lies outside the folder ``root`` (``data.image_root``; symlinks
    followed) from ``report.records`` to ``report.errors``: a records file from elsewhere cannot make the run
    read any other file of this machine."""
    folder = Path(root).resolve()
    kept = LoadReport(report.path, errors=list(report.errors))
    for record, line_no in zip(report.records, report.lines):
        video = () if record.video is None else (*record.video.frames, record.video.path or None)
        paths = [*record.prompt_images, *video, getattr(record.ground_truth, "path", None)]
        outside = [p for p in paths if p is not None and not Path(p).resolve().is_relative_to(folder)]
        if outside:
            kept.errors.append(
                RecordError(
                    f"{report.path}:{line_no} (id {record.id}): {outside[0]} is outside data.image_root {folder}",
                    line_no,
                )
            )
        else:
            kept.records.append(record)
            kept.lines.append(line_no)
    kept.errors.sort(key=lambda err: err.line)
    return kept


def read_records(
    path: str | Path, *, skip_bad: bool = False, check_images: bool = False, image_root: str | Path = ""
) -> list[Record]:
    """Validated records of a JSONL file; with ``check_images`` every image (and mask) is checked too, with
    ``image_root`` every image and mask must lie under that folder.

    The first bad line raises :class:`RecordError`. With ``skip_bad=True`` bad lines are left out and one
    warning line reports how many (use :func:`load_records` to get the individual errors).
    """
    report = load_records(path)
    if image_root:
        report = outside_root(report, image_root)
    if check_images:
        report = drop_bad_images(report)
    if report.errors and not skip_bad:
        raise report.errors[0]
    if report.errors:
        log.warning(
            "%s: skipped %d bad line(s) of %d; first: %s",
            report.path,
            report.skipped,
            report.skipped + len(report.records),
            report.errors[0],
        )
    return report.records


# ---------------------------------------------------------------------------------------------- writing


def _relative_if_inside(path: str, out_dir: str) -> str:
    absolute = os.path.abspath(path)
    rel = os.path.relpath(absolute, out_dir)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return absolute
    return Path(rel).as_posix()


def write_records(path: str | Path, records: Iterable[Record]) -> Path:
    """Write records as JSONL atomically (temp file + ``os.replace``); each record is validated first.

    ``image`` and mask paths inside the output folder are written relative to it, others absolute.
    """
    path = Path(os.path.abspath(path))  # also normalises "dir/../x", whatever exists
    out_dir = str(path.parent)
    os.makedirs(out_dir, exist_ok=True)
    lines, seen = [], set()
    for index, record in enumerate(records):
        obj = record_to_json(record)
        if record.images:
            obj["images"] = [_relative_if_inside(p, out_dir) for p in record.images]
        elif record.image is not None:
            obj["image"] = _relative_if_inside(record.image, out_dir)
        if isinstance(record.ground_truth, MaskRef):
            obj["ground_truth"] = {"mask": _relative_if_inside(record.ground_truth.path, out_dir)}
        if record.video is not None and record.video.path:
            obj["video"]["path"] = _relative_if_inside(record.video.path, out_dir)
        elif record.video is not None:
            obj["video"]["frames"] = [_relative_if_inside(f, out_dir) for f in record.video.frames]
        where = f"{path}: record {index} (id {record.id})"
        try:
            record_from_json(obj, Path(out_dir))
            line = json.dumps(obj, ensure_ascii=False, allow_nan=False)
        except ValueError as err:
            raise RecordError(f"{where}: {err}") from None
        if record.id in seen:
            raise RecordError(f"{where}: id: duplicate id")
        seen.add(record.id)
        lines.append(line + "\n")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; records are shared data
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


__all__ = [
    "GROUND_TRUTH_OF_TASK",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "JSONLimitError",
    "LoadReport",
    "RecordError",
    "drop_bad_images",
    "load_records",
    "loads_bounded",
    "parse_ground_truth",
    "read_records",
    "record_from_json",
    "write_records",
]
