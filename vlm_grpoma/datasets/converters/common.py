"""Shared pieces of the public-format converters: input errors, JSON loading, image roots, coordinates."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpoma.answers import XY
from vlm_grpoma.datasets.images import ImageLoadError, image_size
from vlm_grpoma.datasets.jsonl import JSONLimitError, loads_bounded
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import DataError

#: A coordinate this far (pixels) outside the image is clipped to the border; farther is an error.
BORDER_TOLERANCE = 1.0
_FORMAT_INSTRUCTION = re.compile(r"\s*Your answer should be formatted.*\Z", re.DOTALL)


class ConvertError(DataError):
    """Input that a converter cannot turn into records; the message names the file and entry."""


@dataclass(frozen=True)
class ConvertInputs:
    """What every converter gets: the file or folder the user named, where its images are (None: the format's
    default places next to it), and the output folder (for files a format derives, e.g. binary masks).
    Column-mapped formats (parquet) also get the task, the ``name -> column`` fields and the box format."""

    source: Path
    image_root: Path | None
    output_dir: Path
    task: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    box_format: str = "xyxy"


@dataclass(frozen=True)
class Converted:
    """A converter's records and counts of what it used and left out (printed by ``vlm-grpoma convert``)."""

    records: list[Record]
    counts: dict[str, int]


def checked_image_size(path: Path, where: str) -> tuple[int, int]:
    """(width, height) from the image header; a missing or unreadable image is a ConvertError at ``where``."""
    try:
        return image_size(path)
    except ImageLoadError as err:
        raise ConvertError(f"{where}: {err}") from None


def load_json(path: Path) -> Any:
    try:
        return loads_bounded(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: file not found") from None
    except JSONLimitError as err:
        raise ConvertError(f"{path}: refused JSON: {err}") from None
    except json.JSONDecodeError as err:
        raise ConvertError(
            f"{path}: invalid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConvertError(f"{path}: cannot read: {err}") from None


def load_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, decoded object) for every non-empty line."""
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # U+2028 may sit inside a JSON string
    except FileNotFoundError:
        raise ConvertError(f"{path}: file not found") from None
    rows = []
    for no, line in enumerate(lines, start=1):
        if line.strip():
            try:
                rows.append((no, loads_bounded(line)))
            except json.JSONDecodeError as err:
                raise ConvertError(f"{path}:{no}: invalid JSON: {err.msg}") from None
            except JSONLimitError as err:
                raise ConvertError(f"{path}:{no}: refused JSON: {err}") from None
    return rows


def require(entry: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    """``entry[key]`` checked to be one of ``types`` (bool never counts as a number)."""
    if not isinstance(entry, dict):
        raise ConvertError(f"{where}: must be a JSON object, got {type(entry).__name__}")
    if key not in entry:
        raise ConvertError(f"{where}: missing field {key!r}")
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, types):
        raise ConvertError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def find_image_root(file_name: str, candidates: Sequence[Path], where: str) -> Path:
    """The first candidate folder that holds ``file_name``; the error lists every folder tried."""
    for root in candidates:
        if (root / file_name).is_file():
            return root
    tried = ", ".join(str(c) for c in candidates)
    raise ConvertError(
        f"{where}: image {file_name!r} not found under any of: {tried} (pass the image folder explicitly)"
    )


def clean_instruction(text: str) -> str:
    """An instruction without ``<image>`` tokens and the upstream answer-format sentence.

    RoboPoint / Where2Place questions end with "Your answer should be formatted as a list of tuples ...
    between 0 and 1"; our models answer in the project's own JSON format, so that sentence would contradict
    the adapter's instructions and is removed.
    """
    return _FORMAT_INSTRUCTION.sub("", text.replace("<image>", "")).strip()


def is_normalised(points: Sequence[Sequence[float]]) -> bool:
    """True when every coordinate lies in [0, 1]: fractions of the image size, not pixels.

    A real pixel trajectory never fits inside the top-left pixel, so this test is unambiguous in practice.
    """
    return all(0.0 <= c <= 1.0 for p in points for c in p)


def parse_xy_list(value: Any, where: str) -> list[tuple[float, float]]:
    """A non-empty list of [x, y] pairs of finite numbers."""
    if not isinstance(value, list) or not value:
        raise ConvertError(
            f"{where}: points must be a non-empty list of [x, y], got {json.dumps(value)[:80]}"
        )
    points = []
    for i, p in enumerate(value):
        if (
            not isinstance(p, (list, tuple))
            or len(p) != 2
            or any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) for c in p)
        ):
            raise ConvertError(f"{where}: point {i} must be [x, y] with finite numbers, got {json.dumps(p)}")
        points.append((float(p[0]), float(p[1])))
    return points


def to_pixels(
    points: Sequence[tuple[float, float]], width: int, height: int, where: str
) -> tuple[list[XY], bool]:
    """Pixel points (scaled when normalised, see :func:`is_normalised`) and whether they were normalised.

    Points up to ``BORDER_TOLERANCE`` px outside the image are clipped to it; farther ones are an error.
    """
    normalised = is_normalised(points)
    out = []
    for i, (x, y) in enumerate(points):
        if normalised:
            x, y = x * width, y * height
        if not (
            -BORDER_TOLERANCE <= x <= width + BORDER_TOLERANCE
            and -BORDER_TOLERANCE <= y <= height + BORDER_TOLERANCE
        ):
            raise ConvertError(f"{where}: point {i} ({x:g}, {y:g}) is outside the {width}x{height} image")
        out.append((min(max(x, 0.0), float(width)), min(max(y, 0.0), float(height))))
    return out, normalised


def split_from_name(name: str) -> str:
    """ "train" / "val" / "test" from a file name like instances_val2017.json (default "train")."""
    lowered = name.lower()
    for split in ("train", "val", "test"):
        if split in lowered:
            return split
    return "train"
