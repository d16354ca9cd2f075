"""RoboPoint training data -> affordance records.

Input: a LLaVA-style JSON list ``{"id", "image", "conversations": [{"from": "human", "value":
"<image>\\n..."}, {"from": "gpt", "value": "[(0.56, 0.69), (0.61, 0.70)]"}, ...]}``. Every human/gpt turn
whose answer is a list of (x, y) tuples becomes one record with point ground truth; other turns (VQA text,
4-tuple boxes) are counted and left out. RoboPoint coordinates are fractions of the image size (its prompt
says so); an answer with a coordinate above 1 is read as pixels. Images are relative to the image folder
(default: the JSON file's folder) and must exist (their size is read from the header). The upstream
answer-format sentence is dropped from the instruction (see ``clean_instruction``).

Several images per entry (LLaVA's multi-image form, as in LLaVA-Interleave / LLaVA-OneVision data: ``"image":
["t-2.jpg", "t-1.jpg", "t0.jpg"]`` with one ``<image>`` per image in the first human turn) become records with
``images``; the points are in the last image (the current frame of a history, the view the answer is about),
which is the records' target. A first human turn whose ``<image>`` count differs from the list is refused:
that mismatch is what "image features and image tokens do not match" errors come from later.
"""

from __future__ import annotations

import re

from vlm_grpoma.answers import Points
from vlm_grpoma.datasets.converters.common import (
    Converted,
    ConvertError,
    ConvertInputs,
    checked_image_size,
    clean_instruction,
    load_json,
    require,
    to_pixels,
)
from vlm_grpoma.datasets.schema import Record, with_images

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)"
_POINT_LIST = re.compile(rf"\[\s*{_PAIR}(?:\s*,\s*{_PAIR})*\s*,?\s*\]")


def parse_point_answer(text: str) -> list[tuple[float, float]] | None:
    """The points of a RoboPoint answer "[(x, y), ...]", or None when the text is not such a list."""
    text = text.strip()
    if not _POINT_LIST.fullmatch(text):
        return None
    return [(float(x), float(y)) for x, y in re.findall(_PAIR, text)]


def _images(entry: dict, turns: list, root, where: str) -> list:
    """The entry's image files in prompt order: ``image`` a path, or a list of them whose count the first
    human turn's ``<image>`` placeholders must match (when it has any)."""
    value = require(entry, "image", (str, list), where)
    names = [value] if isinstance(value, str) else value
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConvertError(f"{where}: image must be a path or a non-empty list of paths, got {value!r}")
    first = turns[0].get("value") if turns and isinstance(turns[0], dict) else None
    placeholders = first.count("<image>") if isinstance(first, str) else 0
    if isinstance(value, list) and placeholders and placeholders != len(names):
        raise ConvertError(
            f"{where}: {len(names)} images but {placeholders} <image> placeholders in the first human turn"
        )
    return [root / name for name in names]


def convert_robopoint(inputs: ConvertInputs) -> Converted:
    """Point records, one per point-answer turn, and counts of turns used and left out."""
    json_path, image_root = inputs.source, inputs.image_root
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
        images = _images(entry, turns, root, where)
        image = images[-1]
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
            if size is None:
                size = [checked_image_size(path, where) for path in images][-1]
            pixels, normalised = to_pixels(points, *size, turn_where)
            counts["point_turns"] += 1
            counts["normalised"] += normalised
            record = Record(
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
            records.append(with_images(record, tuple(str(p) for p in images), len(images) - 1))
    return Converted(records, counts)
