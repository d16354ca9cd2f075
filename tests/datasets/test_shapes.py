"""Synthetic shapes: determinism, boxes equal drawn pixels, unique referring expressions, masks, paths."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.answers import Boxes, Trajectory
from vlm_grpoma.datasets.images import load_image, load_mask
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import MaskRef
from vlm_grpoma.datasets.synthetic.shapes import COLOURS, EASY, ShapesConfig, generate_shapes

NORMAL = ShapesConfig()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, list]:
    root = tmp_path_factory.mktemp("shapes")
    return {
        task: read_records(generate_shapes(task, n, root / task, seed=3, split="train", config=NORMAL))
        for task, n in (("detection", 60), ("affordance", 30), ("trajectory", 30))
    }


def _colour_pixels(image: np.ndarray, colour: str) -> np.ndarray:
    return np.all(image == COLOURS[colour], axis=-1)


def _extent(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("task", ["detection", "affordance", "trajectory"])
def test_same_seed_gives_byte_identical_files(tmp_path, task):
    a = generate_shapes(task, 6, tmp_path / "a", seed=11, config=NORMAL).parent
    b = generate_shapes(task, 6, tmp_path / "b", seed=11, config=NORMAL).parent
    c = generate_shapes(task, 6, tmp_path / "c", seed=12, config=NORMAL).parent
    files_a = _files(a)
    assert "records.jsonl" in files_a and len(files_a) >= 7
    assert files_a == _files(b)
    assert files_a["records.jsonl"] != _files(c)["records.jsonl"]


def test_every_object_box_is_the_pixel_extent_of_its_colour(datasets):
    """Per colour, the union of object boxes equals the extent of that exact colour in the image, and every
    box edge touches its object's colour: a box one pixel too big or too small fails."""
    backgrounds = set()
    for rec in datasets["detection"] + datasets["trajectory"] + datasets["affordance"]:
        image = np.asarray(load_image(rec))
        backgrounds.add(rec.meta["background"])
        objects = rec.meta["objects"]
        for colour in {o["colour"] for o in objects}:
            boxes = np.array([o["box"] for o in objects if o["colour"] == colour])
            union = [boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()]
            assert _extent(_colour_pixels(image, colour)) == union, rec.id
        for o in objects:
            x1, y1, x2, y2 = o["box"]
            inside = _colour_pixels(image, o["colour"])[y1:y2, x1:x2]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any(), rec.id
    assert backgrounds == {"solid", "gradient", "noise"}


_DESC = r"the (?:(small|large) )?(\w+) (\w+)"


def _matches(desc: tuple[str, str, str], objects: list[dict]) -> list[int]:
    size, colour, kind = desc
    return [
        i
        for i, o in enumerate(objects)
        if o["colour"] == colour and o["kind"] == kind and (not size or o["size"] == size)
    ]


def _holds(rel: str, a: list[int], b: list[int]) -> bool:
    return {"left of": a[2] <= b[0], "right of": a[0] >= b[2], "above": a[3] <= b[1], "below": a[1] >= b[3]}[
        rel
    ]


def _interpret(expression: str, objects: list[dict]) -> list[int]:
    """A test-local reading of the generator's referring expressions: the indices they pick out."""
    m = re.fullmatch(rf"{_DESC}(?: (left of|right of|above|below) {_DESC})?", expression)
    assert m, expression
    candidates = _matches(m.group(1, 2, 3), objects)
    if m.group(4) is None:
        return candidates
    refs = _matches(m.group(5, 6, 7), objects)
    assert len(refs) == 1, expression  # the landmark itself must be unique
    return [i for i in candidates if _holds(m.group(4), objects[i]["box"], objects[refs[0]]["box"])]


def test_referring_expressions_pick_out_exactly_the_ground_truth(datasets):
    kinds = {"single": 0, "relation": 0, "size": 0, "multi": 0}
    for rec in datasets["detection"]:
        objects, gt = rec.meta["objects"], rec.ground_truth
        assert isinstance(gt, Boxes)
        assert [list(map(int, (b.x1, b.y1, b.x2, b.y2))) for b in gt.boxes] == [
            objects[i]["box"] for i in rec.meta["targets"]
        ]
        expr = rec.meta["expression"]
        assert rec.prompt == f"Find {expr}."
        if expr.startswith("all the "):
            kinds["multi"] += 1
            key = expr[len("all the ") :]
            wanted = [
                i for i, o in enumerate(objects) if (key == f"{o['colour']} shapes") or key == f"{o['kind']}s"
            ]
            assert sorted(rec.meta["targets"]) == wanted and len(wanted) >= 2 and len(wanted) < len(objects)
        else:
            kinds["single"] += 1
            kinds["relation"] += any(r in expr for r in (" left of ", " right of ", " above ", " below "))
            kinds["size"] += expr.startswith(("the small ", "the large "))
            assert _interpret(expr, objects) == rec.meta["targets"], (rec.id, expr)
            assert (
                gt.boxes[0].label == f"{objects[rec.meta['targets'][0]]['colour']} "
                f"{objects[rec.meta['targets'][0]]['kind']}"
            )
    assert all(v >= 3 for v in kinds.values()), kinds  # every kind of prompt occurs


def test_affordance_masks_are_the_named_part_of_the_named_tool(datasets):
    for rec in datasets["affordance"]:
        assert isinstance(rec.ground_truth, MaskRef)
        mask, image = load_mask(rec), np.asarray(load_image(rec))
        tool = rec.meta["objects"][rec.meta["target"]]
        assert rec.prompt == f"Point to the {rec.meta['part']} of the {tool['colour']} {tool['kind']}."
        assert mask.any() and _extent(mask) == rec.meta["part_box"]
        assert np.all(_colour_pixels(image, tool["colour"])[mask])  # the part is drawn in the tool's colour
        x1, y1, x2, y2 = tool["box"]
        assert mask[y1:y2, x1:x2].sum() == mask.sum()  # and lies inside the tool
        tool_pixels = _colour_pixels(image, tool["colour"])[y1:y2, x1:x2].sum()
        share = mask.sum() / tool_pixels
        assert (share < 0.5) if rec.meta["part"] == "handle" else (share > 0.5), (rec.id, share)
        # only one tool answers to the name in the prompt
        assert (
            sum(o["colour"] == tool["colour"] and o["kind"] == tool["kind"] for o in rec.meta["objects"]) == 1
        )


def _samples(points, step=0.25) -> np.ndarray:
    out = []
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        n = max(2, int(np.hypot(x1 - x0, y1 - y0) / step) + 1)
        t = np.linspace(0, 1, n)
        out.append(np.stack([x0 + t * (x1 - x0), y0 + t * (y1 - y0)], axis=1))
    return np.concatenate(out)


def _hits(points, occupied: np.ndarray) -> bool:
    """Whether a polyline, sampled every 0.25 px, enters any True pixel of ``occupied``."""
    s = _samples(points)
    cols = np.clip(np.floor(s[:, 0]).astype(int), 0, occupied.shape[1] - 1)
    rows = np.clip(np.floor(s[:, 1]).astype(int), 0, occupied.shape[0] - 1)
    return bool(occupied[rows, cols].any())


def test_trajectories_go_around_the_obstacle(datasets):
    for rec in datasets["trajectory"]:
        gt = rec.ground_truth
        assert isinstance(gt, Trajectory) and len(gt.points) >= 3
        image = np.asarray(load_image(rec))
        objs = rec.meta["objects"]
        obstacle, start, goal = objs[rec.meta["obstacle"]], objs[rec.meta["start"]], objs[rec.meta["goal"]]
        ox1, oy1, ox2, oy2 = obstacle["box"]
        occupied = np.zeros(image.shape[:2], bool)
        occupied[oy1:oy2, ox1:ox2] = _colour_pixels(image, obstacle["colour"])[oy1:oy2, ox1:ox2]
        assert not _hits(gt.points, occupied), rec.id
        others = np.zeros_like(occupied)  # distractors stay off the path too
        for i, o in enumerate(objs):
            if i not in (rec.meta["start"], rec.meta["goal"]):
                x1, y1, x2, y2 = o["box"]
                others[y1:y2, x1:x2] |= _colour_pixels(image, o["colour"])[y1:y2, x1:x2]
        assert not _hits(gt.points, others), rec.id
        # the straight path would run through it
        assert _hits([gt.points[0], gt.points[-1]], occupied), rec.id
        for (x, y), box in ((gt.points[0], start["box"]), (gt.points[-1], goal["box"])):
            assert box[0] <= x <= box[2] and box[1] <= y <= box[3]
        assert rec.prompt == (
            f"Draw a path from the {start['colour']} {start['kind']} to the {goal['colour']} "
            f"{goal['kind']} around the {obstacle['colour']} {obstacle['kind']}."
        )


def test_easy_preset_matches_the_cpu_demo_data(tmp_path):
    records = read_records(generate_shapes("detection", 40, tmp_path, seed=0, config=EASY))
    counts = set()
    for rec in records:
        assert (rec.width, rec.height) == (112, 112)
        m = re.fullmatch(r"Find the (\w+) (square|circle)\.", rec.prompt)
        assert m and m.group(1) in COLOURS
        objects = rec.meta["objects"]
        counts.add(len(objects))
        assert len(rec.ground_truth.boxes) == 1
        assert _matches(("", m.group(1), m.group(2)), objects) == rec.meta["targets"]
        side = rec.ground_truth.boxes[0]
        assert 16 <= max(side.x2 - side.x1, side.y2 - side.y1) <= 48
        with Image.open(rec.image) as img:
            assert img.size == (112, 112)
    assert counts == {1, 2}


def test_bad_requests_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no 'manipulation' task"):
        generate_shapes("manipulation", 1, tmp_path)
    with pytest.raises(ValueError, match="n must be positive"):
        generate_shapes("detection", 0, tmp_path)
    with pytest.raises(ValueError, match="difficulty must be one of"):
        generate_shapes("detection", 1, tmp_path, config=ShapesConfig(difficulty="hard"))
    with pytest.raises(ValueError, match="colours must be a non-empty subset"):
        generate_shapes("detection", 1, tmp_path, config=ShapesConfig(colours=("mauve",)))
    with pytest.raises(ValueError, match="max_shape_size <= image_size / 2"):
        generate_shapes("detection", 1, tmp_path, config=ShapesConfig(image_size=64, max_shape_size=40))
    impossible = ShapesConfig(
        shapes=("circle",),
        colours=("red",),
        min_distractors=2,
        max_distractors=2,
        difficulty="easy",
        multi_fraction=0.0,
    )
    with pytest.raises(ValueError, match="too restrictive"):
        generate_shapes("trajectory", 1, tmp_path, config=impossible)


def test_size_words_match_drawn_sizes(datasets):
    """Every "small" object is drawn smaller than every "large" one, so "the large red square" is visible."""
    sides = {"small": [], "large": []}
    for rec in datasets["detection"]:
        for o in rec.meta["objects"]:
            x1, y1, x2, y2 = o["box"]
            sides[o["size"]].append(max(x2 - x1, y2 - y1))
    assert len(sides["small"]) > 20 and len(sides["large"]) > 20
    assert max(sides["small"]) < min(sides["large"])


def test_make_data_offers_exactly_the_shape_and_arithmetic_presets(tmp_path, capsys):
    from vlm_grpoma.cli import build_parser, main
    from vlm_grpoma.datasets.synthetic.arithmetic import PRESETS as ARITHMETIC
    from vlm_grpoma.datasets.synthetic.shapes import PRESETS as SHAPES

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["make-data"]
    difficulty = next(a for a in sub._actions if a.dest == "difficulty")
    assert set(difficulty.choices) == set(SHAPES) | set(ARITHMETIC)
    # a preset only the other source has is one line naming the source's presets
    only_arithmetic = sorted(set(ARITHMETIC) - set(SHAPES))[0]
    argv = "make-data --source shapes --task detection --n 1 --difficulty".split() + [only_arithmetic]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 1
    assert f"--difficulty must be one of {sorted(SHAPES)}" in capsys.readouterr().err
