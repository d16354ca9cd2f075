"""COCO instances JSON -> detection records: all boxes of one category in one image form one record.

Input: an ``instances_*.json`` file (``images``, ``annotations``, ``categories``). COCO boxes are
``[x, y, w, h]`` in pixels and become ``[x, y, x + w, y + h]``. Crowd annotations (``iscrowd=1``) and
boxes with no area are left out (counted). Images are looked up next to the JSON file, in a sibling
folder named after the split (``../val2017``), or in ``../images[/<split>]``, unless a folder is given.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    find_image_root,
    load_json,
    require,
    split_from_name,
)
from vlm_grpoma.datasets.schema import Record

_PLURALS = {
    "person": "people",
    "mouse": "mice",
    "knife": "knives",
    "sheep": "sheep",
    "skis": "skis",
    "scissors": "scissors",
}


def plural(name: str) -> str:
    """English plural of a COCO category name ("bus" -> "buses", "wine glass" -> "wine glasses")."""
    head, _, last = name.rpartition(" ")
    if last in _PLURALS:
        word = _PLURALS[last]
    elif last.endswith(("s", "x", "ch", "sh")):
        word = last + "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        word = last[:-1] + "ies"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


@dataclass(frozen=True)
class CocoImage:
    id: int
    file_name: str
    width: int
    height: int


@dataclass(frozen=True)
class CocoIndex:
    """The parts of an instances file the converters use, validated."""

    images: dict[int, CocoImage]
    categories: dict[int, str]
    annotations: dict[int, dict]


def index_instances(path: Path) -> CocoIndex:
    data = load_json(path)
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: must be a COCO instances object with images, annotations, categories")
    images, categories, annotations = {}, {}, {}
    for i, img in enumerate(require(data, "images", list, str(path))):
        where = f"{path}: images[{i}]"
        iid = require(img, "id", int, where)
        w, h = require(img, "width", int, where), require(img, "height", int, where)
        if w <= 0 or h <= 0:
            raise ConvertError(f"{where} (id {iid}): width/height must be positive, got {w}x{h}")
        images[iid] = CocoImage(iid, require(img, "file_name", str, where), w, h)
    for i, cat in enumerate(require(data, "categories", list, str(path))):
        where = f"{path}: categories[{i}]"
        categories[require(cat, "id", int, where)] = require(cat, "name", str, where)
    for i, ann in enumerate(require(data, "annotations", list, str(path))):
        where = f"{path}: annotations[{i}]"
        aid = require(ann, "id", int, where)
        where = f"{where} (id {aid})"
        if require(ann, "image_id", int, where) not in images:
            raise ConvertError(f"{where}: image_id {ann['image_id']} is not in images")
        if require(ann, "category_id", int, where) not in categories:
            raise ConvertError(f"{where}: category_id {ann['category_id']} is not in categories")
        bbox = require(ann, "bbox", list, where)
        if len(bbox) != 4 or any(
            isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) for c in bbox
        ):
            raise ConvertError(f"{where}: bbox must be [x, y, w, h] of finite numbers, got {bbox}")
        annotations[aid] = ann
    return CocoIndex(images, categories, annotations)


def xywh_to_box(bbox: list[float], image: CocoImage, label: str) -> Box | None:
    """COCO ``[x, y, w, h]`` -> a Box clipped to the image, or None when nothing of it is left."""
    x, y, w, h = bbox
    x1, y1 = max(0.0, float(x)), max(0.0, float(y))
    x2, y2 = min(float(image.width), float(x + w)), min(float(image.height), float(y + h))
    if x2 <= x1 or y2 <= y1:
        return None
    return Box(x1, y1, x2, y2, label)


def image_roots(json_path: Path, split_dir: str) -> list[Path]:
    parent = json_path.parent
    return [
        parent,
        parent.parent / split_dir,
        parent.parent / "images" / split_dir,
        parent.parent / "images",
        parent / "images",
        parent.parent,
    ]


def convert_coco(inputs: ConvertInputs) -> Converted:
    """Detection records (one per image x category) and counts of what was left out."""
    json_path, image_root = inputs.source, inputs.image_root
    index = index_instances(json_path)
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    counts = {"crowd": 0, "empty_box": 0}
    for ann in index.annotations.values():
        if ann.get("iscrowd", 0):
            counts["crowd"] += 1
            continue
        groups[(ann["image_id"], ann["category_id"])].append(ann)
    if not groups:
        raise ConvertError(f"{json_path}: no usable (non-crowd) annotations")
    split_dir = json_path.stem.removeprefix("instances_")
    first = index.images[min(groups)[0]]
    root = image_root or find_image_root(first.file_name, image_roots(json_path, split_dir), str(json_path))
    split = split_from_name(json_path.stem)
    records = []
    for (image_id, cat_id), anns in sorted(groups.items()):
        image, name = index.images[image_id], index.categories[cat_id]
        anns = sorted(anns, key=lambda a: a["id"])
        boxes = [xywh_to_box(a["bbox"], image, name) for a in anns]
        counts["empty_box"] += sum(b is None for b in boxes)
        kept = [(a["id"], b) for a, b in zip(anns, boxes) if b is not None]
        if not kept:
            continue
        expr = f"all the {plural(name)}"
        records.append(
            Record(
                id=f"coco-{image_id}-{cat_id}",
                image=str(root / image.file_name),
                task="detection",
                prompt=f"Find {expr}.",
                width=image.width,
                height=image.height,
                ground_truth=Boxes(tuple(b for _, b in kept)),
                split=split,
                meta={
                    "source": "coco",
                    "image_id": image_id,
                    "category_id": cat_id,
                    "category": name,
                    "annotation_ids": [aid for aid, _ in kept],
                    "expression": expr,
                },
            )
        )
    return Converted(records, counts)
