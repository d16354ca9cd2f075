"""ShareRobot (RoboBrain) trajectory JSON -> trajectory records.

Input: a JSON list of entries ``{"id", "instruction", "points": [[x, y], ...], "meta_data":
{"original_width", "original_height", ...}}`` as in the ShareRobot README; the image path is ``image``
(a string or a one-item list) when present, else ``id`` (ShareRobot's own viewer opens ``img_dir/id``), taken
relative to the image folder (default: the JSON file's folder). Width/height come from ``meta_data`` or,
without it, from the image header.

Coordinates: ShareRobot stores pixels; some exports store fractions of the image size. An entry whose
coordinates all lie in [0, 1] is treated as normalised and scaled (a pixel path never fits inside one
pixel); ``meta.normalised_input`` records which. Points within 1 px outside the image are clipped.
"""

from __future__ import annotations

from pathlib import Path

from vlm_grpoma.answers import Trajectory
from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    load_json,
    parse_xy_list,
    require,
    to_pixels,
)
from vlm_grpoma.datasets.images import ImageLoadError, image_size
from vlm_grpoma.datasets.schema import Record


def _image_name(entry: dict, where: str) -> str:
    image = entry.get("image", entry.get("id"))
    if isinstance(image, list) and len(image) == 1:
        image = image[0]
    if not isinstance(image, str) or not image:
        raise ConvertError(f"{where}: needs an image path in 'image' (or a string 'id'), got {image!r}")
    return image


def _size(entry: dict, path: Path, where: str) -> tuple[int, int]:
    meta = entry.get("meta_data") or {}
    w, h = meta.get("original_width"), meta.get("original_height")
    if w is None and h is None:
        try:
            return image_size(path)
        except ImageLoadError as err:
            raise ConvertError(f"{where}: no meta_data size and {err}") from None
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == int(v) for v in (w, h)
    ):
        raise ConvertError(
            f"{where}: meta_data original_width/height must be positive integers, got {w}, {h}"
        )
    return int(w), int(h)


def convert_sharerobot(inputs: ConvertInputs) -> Converted:
    """Trajectory records and counts (how many inputs were normalised)."""
    json_path, image_root = inputs.source, inputs.image_root
    entries = load_json(json_path)
    if not isinstance(entries, list) or not entries:
        raise ConvertError(f"{json_path}: must be a non-empty JSON list of trajectory entries")
    root = image_root or json_path.parent
    records, counts = [], {"normalised": 0, "pixels": 0}
    for i, entry in enumerate(entries):
        where = f"{json_path}: entry {i}"
        if isinstance(entry, dict) and "id" in entry:
            where += f" (id {entry['id']})"
        instruction = require(entry, "instruction", str, where).strip()
        if not instruction:
            raise ConvertError(f"{where}: instruction is empty")
        points = parse_xy_list(require(entry, "points", list, where), where)
        if len(points) < 2:
            raise ConvertError(f"{where}: a trajectory needs at least 2 points, got {len(points)}")
        image = root / _image_name(entry, where)
        width, height = _size(entry, image, where)
        pixels, normalised = to_pixels(points, width, height, where)
        counts["normalised" if normalised else "pixels"] += 1
        meta = {"source": "sharerobot", "source_id": entry.get("id"), "normalised_input": normalised}
        if isinstance(entry.get("meta_data"), dict) and "original_dataset" in entry["meta_data"]:
            meta["original_dataset"] = entry["meta_data"]["original_dataset"]
        records.append(
            Record(
                id=f"sharerobot-{i:06d}",
                image=str(image),
                task="trajectory",
                prompt=instruction,
                width=width,
                height=height,
                ground_truth=Trajectory(tuple(pixels)),
                split="train",
                meta=meta,
            )
        )
    return Converted(records, counts)
