"""Parquet tables (a Hugging Face ``datasets`` download, or your own) -> records, by naming the columns.

Input: a ``.parquet`` file or a folder searched for them (the hub layout ``data/train-00000-of-00002.parquet``).
Which column holds what is given with ``--field NAME=COLUMN``:

- ``image`` (default ``image``): a hub ``Image`` column (``{"bytes", "path"}``; bytes are written to
  ``<output>/images/``), raw image bytes, or a path relative to ``--image-root`` (default: the parquet's folder);
- or ``images``: a list column of such values, several images per row in prompt order (multi-view, history
  frames; a hub ``Sequence(Image)``), with ``target_image`` an integer column naming the one the ground truth
  is in (default 0);
- ``prompt`` (required): the referring expression or instruction; a list column (lmms-lab/RefCOCO's
  ``answer``: every expression of the object) gives one record per element, id ``<row id>-<index>``, sharing
  the row's image and ground truth;
- the ground truth of ``--task``: ``boxes`` (detection, affordance), ``points`` (affordance) or ``trajectory``;
  a value is a list of numbers (one box / point), a list of them, objects with ``bbox_2d`` / ``point_2d``, or
  that as a JSON string;
- optional ``id``, ``split`` (default: the file name's split, ``testA-00000-of-00001.parquet`` -> ``testA``,
  else ``train``) and ``label`` (the label of every box of the row).

Coordinates are pixels, or fractions of the image size when every value of a row lies in [0, 1]; boxes are
``[x1, y1, x2, y2]`` unless ``--box-format xywh`` (COCO). Embedded images are named by the row id and a
hash of their bytes, so ids that sanitise alike (``cat/1``, ``cat_1``) never share a file. When every record
gets the same prompt a warning says so (a fixed instruction column named as ``prompt``). Needs pyarrow
(``pip install pyarrow``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from vlm_grpoma.answers import Box, Boxes, Points, Trajectory
from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    checked_image_size,
    to_pixels,
)
from vlm_grpoma.datasets.schema import Record, with_images
from vlm_grpoma.errors import MissingDependencyError

#: The ground-truth field names each task takes from a column.
GROUND_TRUTH_FIELDS: dict[str, tuple[str, ...]] = {
    "detection": ("boxes",),
    "affordance": ("points", "boxes"),
    "trajectory": ("trajectory",),
}
FIELDS = (
    "image",
    "images",
    "target_image",
    "prompt",
    "id",
    "split",
    "label",
    "boxes",
    "points",
    "trajectory",
)
_HUB_SHARD = re.compile(r"^(?P<split>.+?)-\d{5}-of-\d{5}$")
_BATCH_ROWS = 256

log = logging.getLogger(__name__)


def pyarrow_parquet(source_format: str = "parquet") -> Any:
    """``pyarrow.parquet``, or a MissingDependencyError saying ``--from source_format`` needs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError(f"--from {source_format} needs pyarrow: pip install pyarrow") from None
    return pq


def parquet_files(source: Path) -> list[Path]:
    files = sorted(source.rglob("*.parquet")) if source.is_dir() else [source]
    if not files:
        raise ConvertError(f"{source}: no .parquet files in this folder or below it")
    return files


def split_of_file(path: Path) -> str:
    """The split a hub shard name carries (``val-00000-of-00001.parquet`` -> ``val``), else ``train``."""
    match = _HUB_SHARD.match(path.stem)
    return match.group("split") if match else "train"


def _numbers(value: Any, where: str) -> list:
    """A JSON string decoded; anything else as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ConvertError(f"{where}: not JSON: {value[:80]!r}") from None
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _items(value: Any, key: str, size: int, where: str) -> list[tuple[list[float], str]]:
    """(coordinates, label) per item: ``[n, ...]`` is one item, ``[[n, ...], ...]`` or ``[{key: [...]}, ...]``
    several."""
    value = _numbers(value, where)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConvertError(f"{where}: expected a non-empty list, got {json.dumps(value)[:80]}")
    if all(_is_number(v) for v in value):
        value = [value]
    items = []
    for i, item in enumerate(value):
        label = ""
        if isinstance(item, dict):
            label = item.get("label", "") if isinstance(item.get("label", ""), str) else ""
            item = item.get(key, item.get(key.removesuffix("_2d")))
        if not isinstance(item, list) or len(item) != size or not all(_is_number(v) for v in item):
            raise ConvertError(f"{where}: item {i} must be {size} numbers, got {json.dumps(item)[:80]}")
        items.append(([float(v) for v in item], label))
    return items


def parse_boxes(
    value: Any, width: int, height: int, box_format: str, label: str, where: str
) -> tuple[Boxes, bool]:
    """Boxes in pixels (xywh turned into corners, scaled when normalised) and whether they were normalised."""
    items, corners = _items(value, "bbox_2d", 4, where), []
    for (x1, y1, a, b), _ in items:
        x2, y2 = (x1 + a, y1 + b) if box_format == "xywh" else (a, b)
        corners += [(x1, y1), (x2, y2)]
    pixels, normalised = to_pixels(corners, width, height, where)  # clipped within 1 px of the border
    boxes = []
    for i, (_, own_label) in enumerate(items):
        (x1, y1), (x2, y2) = pixels[2 * i], pixels[2 * i + 1]
        if x2 <= x1 or y2 <= y1:
            raise ConvertError(f"{where}: box {i} [{x1:g}, {y1:g}, {x2:g}, {y2:g}] has no area")
        boxes.append(Box(x1, y1, x2, y2, label or own_label))
    return Boxes(tuple(boxes)), normalised


def _image_of(value: Any, row_id: str, inputs: ConvertInputs, folder: Path, where: str) -> Path:
    """The image file of a row; embedded bytes are written to ``<output>/images/<id>.<ext>`` first."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        try:
            with Image.open(io.BytesIO(value)) as img:
                ext = (img.format or "png").lower().replace("jpeg", "jpg")
        except (OSError, SyntaxError, ValueError) as err:
            raise ConvertError(f"{where}: image bytes do not decode: {err}") from None
        digest = hashlib.sha256(bytes(value)).hexdigest()[:16]  # the content names the file: no overwrites
        name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', row_id)[:80]}-{digest}.{ext}"
        path = inputs.output_dir / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            path.write_bytes(bytes(value))
        return path
    if isinstance(value, str) and value:
        return (inputs.image_root or folder) / value
    raise ConvertError(
        f"{where}: image must be bytes, a hub Image value or a path, got {type(value).__name__}"
    )


def parquet_rows(pq: Any, file: Path, fields: dict[str, str]) -> Iterator[tuple[int, dict]]:
    """(row index, row as a dict) of the ``fields`` columns of one parquet file, read in batches; a missing
    column is a ConvertError naming the file, the ``--field`` and the columns there are."""
    table = pq.ParquetFile(file)
    columns = table.schema_arrow.names
    missing = [f"{name}={column}" for name, column in fields.items() if column not in columns]
    if missing:
        raise ConvertError(f"{file}: no column for --field {missing[0]}; columns: {', '.join(columns)}")
    rows = (
        row
        for batch in table.iter_batches(batch_size=_BATCH_ROWS, columns=sorted(set(fields.values())))
        for row in batch.to_pylist()
    )
    yield from enumerate(rows)


def _column(row: dict, fields: dict[str, str], name: str, where: str) -> Any:
    value = row.get(fields[name])
    if value is None:
        raise ConvertError(f"{where}: column {fields[name]!r} ({name}) is empty")
    return value


def convert_parquet(inputs: ConvertInputs) -> Converted:
    """Records of ``inputs.task`` from every row of the parquet file(s); counts per file and normalised rows."""
    pq = pyarrow_parquet()
    task = inputs.task
    if task not in GROUND_TRUTH_FIELDS:
        raise ConvertError(
            f"--task: the parquet reader makes {', '.join(GROUND_TRUTH_FIELDS)} records; got {task!r}"
        )
    if "image" in inputs.fields and "images" in inputs.fields:
        raise ConvertError(
            "--field: give image=COLUMN (one image a row) or images=COLUMN (several), not both"
        )
    if "target_image" in inputs.fields and "images" not in inputs.fields:
        raise ConvertError("--field target_image=COLUMN names one of images=COLUMN; give that too")
    fields = {**({} if "images" in inputs.fields else {"image": "image"}), **inputs.fields}
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ConvertError(f"--field {unknown[0]}: unknown; fields are {', '.join(FIELDS)}")
    truth = [name for name in GROUND_TRUTH_FIELDS[task] if name in fields]
    if "prompt" not in fields or len(truth) != 1:
        raise ConvertError(
            f"--field: {task} needs prompt=COLUMN and one of {', '.join(f'{n}=COLUMN' for n in GROUND_TRUTH_FIELDS[task])}"
        )
    truth_name = truth[0]
    records, counts = [], {"rows": 0, "normalised": 0}
    for file in parquet_files(inputs.source):
        for row_index, row in parquet_rows(pq, file, fields):
            where = f"{file}: row {row_index}"
            row_id = str(row[fields["id"]]) if "id" in fields else f"{file.stem}-{row_index:06d}"
            where += f" (id {row_id})"
            prompts = _prompts(_column(row, fields, "prompt", where), where)
            images, target = _row_images(row, fields, row_id, inputs, file.parent, where)
            sizes = [checked_image_size(path, where) for path in images]  # each exists, its header reads
            image, (width, height) = images[target], sizes[target]
            value = _column(row, fields, truth_name, where)
            if truth_name == "boxes":
                label = str(row[fields["label"]]) if "label" in fields else ""
                ground_truth, normalised = parse_boxes(value, width, height, inputs.box_format, label, where)
            else:
                points = [c for c, _ in _items(value, "point_2d", 2, where)]
                pixels, normalised = to_pixels([tuple(p) for p in points], width, height, where)
                if truth_name == "trajectory" and len(pixels) < 2:
                    raise ConvertError(f"{where}: a trajectory needs at least 2 points")
                ground_truth = (Trajectory if truth_name == "trajectory" else Points)(tuple(pixels))
            counts["rows"] += 1
            counts["normalised"] += normalised
            meta = {"source": "parquet", "file": file.name, "row": row_index}
            listed = isinstance(row[fields["prompt"]], list)  # one record per element
            for i, prompt in enumerate(prompts):
                record = Record(
                    id=f"{row_id}-{i}" if listed else row_id,
                    image=str(image),
                    task=task,
                    prompt=prompt,
                    width=width,
                    height=height,
                    ground_truth=ground_truth,
                    split=str(row[fields["split"]]) if "split" in fields else split_of_file(file),
                    meta={**meta, "expression": i} if listed else meta,
                )
                records.append(with_images(record, tuple(str(p) for p in images), target))
    _warn_if_one_prompt(records, fields["prompt"])
    return Converted(records, counts)


def _row_images(
    row: dict, fields: dict[str, str], row_id: str, inputs: ConvertInputs, folder: Path, where: str
) -> tuple[list[Path], int]:
    """The row's image files in prompt order and the index of the target: ``image`` alone, or the list
    ``images`` (each element written out or resolved like one ``image``) and ``target_image``."""
    if "images" not in fields:
        return [_image_of(_column(row, fields, "image", where), row_id, inputs, folder, where)], 0
    values = _column(row, fields, "images", where)
    if not isinstance(values, list) or not values:
        raise ConvertError(f"{where}: column {fields['images']!r} (images) must be a non-empty list")
    images = [
        _image_of(v, f"{row_id}-{j}", inputs, folder, f"{where}: images[{j}]") for j, v in enumerate(values)
    ]
    target = _column(row, fields, "target_image", where) if "target_image" in fields else 0
    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < len(images):
        raise ConvertError(f"{where}: target_image must index the row's {len(images)} images, got {target!r}")
    return images, target


def _prompts(value: Any, where: str) -> list[str]:
    """The prompt texts of a row: one string, or each element of a list column."""
    texts = value if isinstance(value, list) else [value]
    if not texts:
        raise ConvertError(f"{where}: the prompt list is empty")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            at = f" element {i}" if isinstance(value, list) else ""
            raise ConvertError(f"{where}: prompt{at} must be non-empty text, got {text!r}")
    return [text.strip() for text in texts]


def _warn_if_one_prompt(records: list[Record], column: str) -> None:
    """A dataset whose every record asks the same thing is almost always the wrong column as prompt."""
    if len(records) > 1 and len({r.prompt for r in records}) == 1:
        log.warning(
            "every one of the %d records has the same prompt %r (column %s): if the referring expressions are "
            "in another column, name it with --field prompt=COLUMN (a list column gives one record per element)",
            len(records),
            records[0].prompt[:80],
            column,
        )
