"""The Where2Place benchmark -> affordance records with mask ground truth.

Input: the folder holding ``point_questions.jsonl`` (``{"question_id", "image": "00.jpg", "text"}``),
``images/`` and ``masks/`` (``<image stem>.png`` or ``.jpg``), or that JSONL file itself. The masks are
JPEG-compressed greyscale in the release, so they are thresholded at 128 and written as binary PNGs into
``masks/`` of the output folder. The upstream answer-format sentence is dropped from the instruction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    checked_image_size,
    clean_instruction,
    load_jsonl,
    require,
)
from vlm_grpoma.datasets.images import ImageLoadError, load_image
from vlm_grpoma.datasets.schema import MaskRef, Record


def _mask_file(folder: Path, image_name: str, where: str) -> Path:
    stem = Path(image_name).stem
    for ext in (".png", ".jpg", ".jpeg"):
        if (folder / "masks" / f"{stem}{ext}").is_file():
            return folder / "masks" / f"{stem}{ext}"
    raise ConvertError(f"{where}: no mask {folder / 'masks' / stem}.png/.jpg")


def convert_where2place(inputs: ConvertInputs) -> Converted:
    """Mask records for every question; binary mask PNGs are written to ``<output folder>/masks``."""
    folder, out_dir = inputs.source, inputs.output_dir
    questions = folder / "point_questions.jsonl" if folder.is_dir() else folder
    folder = questions.parent
    rows = load_jsonl(questions)
    if not rows:
        raise ConvertError(f"{questions}: no questions")
    (out_dir / "masks").mkdir(parents=True, exist_ok=True)
    records, seen = [], set()
    for line_no, row in rows:
        where = f"{questions}:{line_no}"
        qid = require(row, "question_id", (int, str), where)
        where += f" (question_id {qid})"
        if qid in seen:
            raise ConvertError(f"{where}: duplicate question_id")
        seen.add(qid)
        image_name = require(row, "image", str, where)
        image = folder / "images" / image_name
        width, height = checked_image_size(image, where)
        try:
            grey = np.asarray(load_image(_mask_file(folder, image_name, where)).convert("L"))
        except ImageLoadError as err:
            raise ConvertError(f"{where}: {err}") from None
        if grey.shape != (height, width):
            raise ConvertError(
                f"{where}: mask is {grey.shape[1]}x{grey.shape[0]} but the image is {width}x{height}"
            )
        region = grey >= 128  # JPEG masks: compression noise sits well below the threshold
        if not region.any():
            raise ConvertError(f"{where}: mask is empty")
        mask_path = out_dir / "masks" / f"where2place-{qid}.png"
        Image.fromarray(region.astype(np.uint8) * 255, "L").save(mask_path, format="PNG")
        records.append(
            Record(
                id=f"where2place-{qid}",
                image=str(image),
                task="affordance",
                prompt=clean_instruction(require(row, "text", str, where)),
                width=width,
                height=height,
                ground_truth=MaskRef(str(mask_path)),
                split="test",
                meta={"source": "where2place", "question_id": qid, "category": row.get("category", "")},
            )
        )
    return Converted(records, {"questions": len(records)})
