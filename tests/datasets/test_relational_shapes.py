"""Relational shapes records (``make-data --difficulty relational``): the named object is the one the relation
picks (checked from the drawn pixels and boxes, not from the generator's own ranking), the thought lists every
object and concludes on it, a wrong thought concludes elsewhere, and the thought is several times the answer."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.synthetic.relational import POSITION_GAP, Choice, SceneObject, thought_text
from vlm_grpoma.datasets.synthetic.shapes import COLOURS, RELATIONAL, generate_shapes

N = 60


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = generate_shapes("detection", N, tmp_path_factory.mktemp("relational"), seed=3, config=RELATIONAL)
    return read_records(path)


def _centre(box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def _members(objects: list[dict], name: str) -> list[int]:
    """Objects a group name ("red shape", "circle") covers."""
    if name.endswith(" shape"):
        return [i for i, o in enumerate(objects) if o["colour"] == name.removesuffix(" shape")]
    return [i for i, o in enumerate(objects) if o["kind"] == name]


def _expected(objects: list[dict], expression: str) -> int | None:
    """The object a position expression names, computed from the boxes (None for size expressions)."""
    axis_of = {"leftmost": (0, 1), "rightmost": (0, -1), "topmost": (1, 1), "bottom-most": (1, -1)}
    if m := re.fullmatch(r"the (leftmost|rightmost|topmost|bottom-most) (.+)", expression):
        axis, sign = axis_of[m[1]]
        group = _members(objects, m[2])
        return min(group, key=lambda i: sign * _centre(objects[i]["box"])[axis])
    if m := re.fullmatch(r"the second (.+) from the (left|top)", expression):
        axis = 0 if m[2] == "left" else 1
        return sorted(_members(objects, m[1]), key=lambda i: _centre(objects[i]["box"])[axis])[1]
    if m := re.fullmatch(r"the shape (left of|right of|above|below) the (\w+) (\w+)", expression):
        [ref] = [o for o in objects if (o["colour"], o["kind"]) == (m[2], m[3])]
        x0, y0, x1, y1 = ref["box"]
        test = {
            "left of": lambda b: b[2] + POSITION_GAP <= x0,
            "right of": lambda b: b[0] >= x1 + POSITION_GAP,
            "above": lambda b: b[3] + POSITION_GAP <= y0,
            "below": lambda b: b[1] >= y1 + POSITION_GAP,
        }[m[1]]
        [hit] = [i for i, o in enumerate(objects) if o is not ref and test(o["box"])]
        return hit
    return None


def test_the_named_object_is_the_one_the_relation_picks(records):
    checked = 0
    for record in records:
        meta, [box] = record.meta, record.ground_truth.boxes
        objects = meta["objects"]
        assert 3 <= len(objects) <= 6 and record.prompt == f"Find {meta['expression']}."
        assert [box.x1, box.y1, box.x2, box.y2] == objects[meta["choice"]["index"]]["box"]
        expected = _expected(objects, meta["expression"])
        if expected is not None:
            assert expected == meta["choice"]["index"], record.id
            checked += 1
    assert checked >= N // 2  # most expressions are positional; size ones are checked from pixels below


def test_size_expressions_follow_the_drawn_pixels(records):
    image_colours = {name: np.array(rgb) for name, rgb in COLOURS.items()}
    checked = 0
    for record in records:
        m = re.fullmatch(r"the (largest|smallest) (.+)", record.meta["expression"])
        if not m:
            continue
        pixels = np.asarray(Image.open(record.image).convert("RGB")).astype(int)
        objects = record.meta["objects"]
        areas = {}
        for i in _members(objects, m[2]):
            x0, y0, x1, y1 = objects[i]["box"]
            patch = pixels[y0 : y1 + 1, x0 : x1 + 1]
            colour = image_colours[objects[i]["colour"]]
            areas[i] = int((np.abs(patch - colour).sum(axis=-1) < 30).sum())
        pick = max(areas, key=areas.get) if m[1] == "largest" else min(areas, key=areas.get)
        assert pick == record.meta["choice"]["index"], record.id
        checked += 1
    assert checked >= 3


def test_the_thought_lists_every_object_and_a_wrong_one_concludes_elsewhere(records):
    for record in records:
        meta = record.meta
        objects = [
            SceneObject(o["kind"], o["colour"], o["size"], tuple(o["box"]), 0) for o in meta["objects"]
        ]
        choice = Choice(**{**meta["choice"], "candidates": tuple(meta["choice"]["candidates"])})
        assert meta["thought"] == thought_text(objects, choice, record.width)
        assert meta["thought"].startswith(f"I see {len(objects)} shapes: ")
        descriptions = {o.describe(record.width) for o in objects}
        assert len(descriptions) == len(objects)  # the conclusion names exactly one object
        assert all(d in meta["thought"] for d in descriptions)
        conclusion = meta["thought"].rsplit(" is ", 1)[1]
        assert conclusion == objects[choice.index].describe(record.width) + "."
        other = next(i for i in range(len(objects)) if i != choice.index)
        wrong = thought_text(objects, choice, record.width, chosen=other)
        assert wrong != meta["thought"] and wrong.endswith(objects[other].describe(record.width) + ".")


def test_the_thought_is_at_least_four_times_the_answer(records, tiny_model_dir):
    from transformers import AutoTokenizer

    from vlm_grpoma.answers import format_answer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir("qwen2_5_vl"))
    thought = np.mean([len(tokenizer(r.meta["thought"]).input_ids) for r in records])
    answer = np.mean([len(tokenizer(format_answer(r.ground_truth)).input_ids) for r in records])
    assert thought >= 4 * answer, (thought, answer)


def test_same_seed_same_records(tmp_path, records):
    again = read_records(generate_shapes("detection", N, tmp_path, seed=3, config=RELATIONAL))
    assert [(r.prompt, r.ground_truth, r.meta) for r in again] == [
        (r.prompt, r.ground_truth, r.meta) for r in records
    ]
