"""RefCOCO / RefCOCO+ / RefCOCOg refs -> one detection record per referring sentence.

Input: the dataset folder (``refcoco/``) holding ``instances.json`` and the refs as JSON
(``refs(unc).json``, ``refs(google).json``, ``refs(umd).json`` or ``refs.json``), or the refs JSON file itself
with ``instances.json`` beside it. Upstream ships the refs as a Python pickle (``refs(unc).p``); unpickling
runs arbitrary code, so it is never loaded here. Convert a copy you trust once with::

    python -c "import json, pickle; json.dump(pickle.load(open('refs(unc).p', 'rb')), open('refs(unc).json', 'w'))"

Each ref (``ref_id``, ``ann_id``, ``image_id``, ``split``, ``sentences[].sent``) takes its box from the
instances annotation ``ann_id`` (COCO ``[x, y, w, h]``); images are the COCO train2014 files, looked up in
``images/``, ``../images/train2014``, ``../train2014`` or ``../images`` unless a folder is given.
"""

from __future__ import annotations

from pathlib import Path

from vlm_grpoma.answers import Boxes
from vlm_grpoma.datasets.converters.coco import index_instances, xywh_to_box
from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    find_image_root,
    load_json,
    require,
)
from vlm_grpoma.datasets.schema import Record

_REFS_NAMES = ("refs(unc).json", "refs(google).json", "refs(umd).json", "refs.json")


def _locate(path: Path) -> tuple[Path, Path]:
    """(refs JSON, instances.json) from a folder or a refs file."""
    if path.is_dir():
        found = [path / n for n in _REFS_NAMES if (path / n).is_file()]
        if not found:
            pickles = sorted(p.name for p in path.glob("refs*.p"))
            hint = (
                (
                    f"; found {pickles}: pickles are not loaded (they can run code), dump the refs list to JSON "
                    "as documented in vlm_grpoma/datasets/converters/refcoco.py"
                )
                if pickles
                else ""
            )
            raise ConvertError(f"{path}: no refs JSON ({', '.join(_REFS_NAMES)}){hint}")
        refs, folder = found[0], path
    elif path.suffix == ".p":
        raise ConvertError(
            f"{path}: pickled refs are not loaded (they can run code); dump the list to JSON "
            "as documented in vlm_grpoma/datasets/converters/refcoco.py"
        )
    else:
        refs, folder = path, path.parent
    instances = folder / "instances.json"
    if not instances.is_file():
        raise ConvertError(f"{folder}: instances.json (the COCO annotations of the refs) not found")
    return refs, instances


def convert_refcoco(inputs: ConvertInputs) -> Converted:
    """Detection records, one per sentence, and counts of what was read."""
    path, image_root = inputs.source, inputs.image_root
    refs_path, instances_path = _locate(path)
    index = index_instances(instances_path)
    refs = load_json(refs_path)
    if not isinstance(refs, list) or not refs:
        raise ConvertError(f"{refs_path}: must be a non-empty JSON list of refs")
    records, counts, root = [], {"refs": 0, "empty_box": 0}, image_root
    for i, ref in enumerate(refs):
        where = f"{refs_path}: refs[{i}]"
        ref_id = require(ref, "ref_id", int, where)
        where = f"{where} (ref_id {ref_id})"
        ann_id, image_id = require(ref, "ann_id", int, where), require(ref, "image_id", int, where)
        split, sentences = require(ref, "split", str, where), require(ref, "sentences", list, where)
        if ann_id not in index.annotations:
            raise ConvertError(f"{where}: ann_id {ann_id} is not in {instances_path}")
        ann = index.annotations[ann_id]
        if ann["image_id"] != image_id:
            raise ConvertError(
                f"{where}: image_id {image_id} differs from annotation {ann_id}'s {ann['image_id']}"
            )
        image, label = index.images[image_id], index.categories[ann["category_id"]]
        box = xywh_to_box(ann["bbox"], image, label)
        if box is None:
            counts["empty_box"] += 1
            continue
        if root is None:
            candidates = [
                instances_path.parent / "images",
                instances_path.parent.parent / "images" / "train2014",
                instances_path.parent.parent / "train2014",
                instances_path.parent.parent / "images",
                instances_path.parent,
            ]
            root = find_image_root(image.file_name, candidates, where)
        counts["refs"] += 1
        for j, sentence in enumerate(sentences):
            text = require(sentence, "sent", str, f"{where}: sentences[{j}]").strip()
            if not text:
                raise ConvertError(f"{where}: sentences[{j}] is empty")
            sent_id = sentence.get("sent_id", j)
            records.append(
                Record(
                    id=f"refcoco-{ref_id}-{sent_id}",
                    image=str(root / image.file_name),
                    task="detection",
                    prompt=f'Find "{text}".',
                    width=image.width,
                    height=image.height,
                    ground_truth=Boxes((box,)),
                    split=split,
                    meta={
                        "source": "refcoco",
                        "ref_id": ref_id,
                        "ann_id": ann_id,
                        "image_id": image_id,
                        "sent_id": sent_id,
                        "category": label,
                        "expression": text,
                    },
                )
            )
    return Converted(records, counts)
