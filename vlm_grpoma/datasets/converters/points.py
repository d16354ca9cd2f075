"""RoboPoint training data and the Where2Place benchmark -> affordance records.

RoboPoint: a LLaVA-style JSON list ``{"id", "image", "conversations": [{"from": "human", "value":
"<image>\\n..."}, {"from": "gpt", "value": "[(0.56, 0.69), (0.61, 0.70)]"}, ...]}``. Every human/gpt turn
whose answer is a list of (x, y) tuples becomes one record with point ground truth; other turns (VQA text,
4-tuple boxes) are counted and left out. RoboPoint coordinates are fractions of the image size (its prompt
says so); an answer with a coordinate above 1 is read as pixels. Images are relative to the image folder
(default: the JSON file's folder) and must exist (their size is read from the header).

Where2Place: the folder holding ``point_questions.jsonl`` (``{"question_id", "image": "00.jpg", "text"}``),
``images/`` and ``masks/`` (``<image stem>.png`` or ``.jpg``). The masks are JPEG-compressed greyscale in
the release, so they are thresholded at 128 and written as binary PNGs into ``masks/`` next to the output.

Both drop the upstream answer-format sentence from the instruction (see ``clean_instruction``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from PIL import Image

from vlm_grpoma.answers import Points
from vlm_grpoma.datasets.converters.common import (
    ConvertError,
    clean_instruction,
    load_json,
    load_jsonl,
    require,
    to_pixels,
)
from vlm_grpoma.datasets.images import ImageLoadError, image_size, load_image
from vlm_grpoma.datasets.schema import MaskRef, Record

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)"
_POINT_LIST = re.compile(rf"\[\s*{_PAIR}(?:\s*,\s*{_PAIR})*\s*,?\s*\]")


def parse_point_answer(text: str) -> list[tuple[float, float]] | None:
    """The points of a RoboPoint answer "[(x, y), ...]", or None when the text is not such a list."""
    text = text.strip()
    if not _POINT_LIST.fullmatch(text):
        return None
    return [(float(x), float(y)) for x, y in re.findall(_PAIR, text)]


def _size(path: Path, where: str) -> tuple[int, int]:
    try:
        return image_size(path)
    except ImageLoadError as err:
        raise ConvertError(f"{where}: {err}") from None


def convert_robopoint(json_path: Path, image_root: Path | None = None) -> tuple[list[Record], dict[str, int]]:
    """Point records, one per point-answer turn, and counts of turns used and left out."""
    entries = load_json(json_path)
    if not isinstance(entries, list) or not entries:
        raise ConvertError(f"{json_path}: must be a non-empty JSON list of conversations")
    root = image_root or json_path.parent
    records, counts = [], {"point_turns": 0, "other_turns": 0, "normalised": 0}
    for i, entry in enumerate(entries):
        where = f"{json_path}: entry {i}"
        entry_id = require(entry, "id", (str, int), where)
        where += f" (id {entry_id})"
        turns = require(entry, "conversations", list, where)
        image = root / require(entry, "image", str, where)
        size = None
        for t in range(0, len(turns) - 1, 2):
            human, gpt = turns[t], turns[t + 1]
            turn_where = f"{where}: conversations[{t}:{t + 2}]"
            if (
                require(human, "from", str, turn_where) != "human"
                or require(gpt, "from", str, turn_where) != "gpt"
            ):
                raise ConvertError(f"{turn_where}: expected a human turn followed by a gpt turn")
            points = parse_point_answer(require(gpt, "value", str, turn_where))
            if points is None:
                counts["other_turns"] += 1
                continue
            size = size or _size(image, where)
            pixels, normalised = to_pixels(points, *size, turn_where)
            counts["point_turns"] += 1
            counts["normalised"] += normalised
            records.append(
                Record(
                    id=f"robopoint-{entry_id}-{t // 2}",
                    image=str(image),
                    task="affordance",
                    prompt=clean_instruction(require(human, "value", str, turn_where)),
                    width=size[0],
                    height=size[1],
                    ground_truth=Points(tuple(pixels)),
                    split="train",
                    meta={
                        "source": "robopoint",
                        "source_id": entry_id,
                        "turn": t // 2,
                        "normalised_input": normalised,
                    },
                )
            )
    return records, counts


def _mask_file(folder: Path, image_name: str, where: str) -> Path:
    stem = Path(image_name).stem
    for ext in (".png", ".jpg", ".jpeg"):
        if (folder / "masks" / f"{stem}{ext}").is_file():
            return folder / "masks" / f"{stem}{ext}"
    raise ConvertError(f"{where}: no mask {folder / 'masks' / stem}.png/.jpg")


def convert_where2place(folder: Path, out_dir: Path) -> tuple[list[Record], dict[str, int]]:
    """Mask records for every question; binary mask PNGs are written to ``out_dir/masks``."""
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
        width, height = _size(image, where)
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
    return records, {"questions": len(records)}
