"""Converters on small fixtures written in each public format (images made with PIL)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
from pycocotools.coco import COCO

from vlm_grpoma.answers import Points, Trajectory
from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.converters import convert
from vlm_grpoma.datasets.converters.coco import plural
from vlm_grpoma.datasets.converters.common import ConvertError
from vlm_grpoma.datasets.converters.robopoint import parse_point_answer
from vlm_grpoma.datasets.images import load_image, load_mask
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import MaskRef


def _image(path: Path, size: tuple[int, int], colour=(120, 130, 140)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def _dump(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


# ---------------------------------------------------------------------------------------------- COCO


def _coco_fixture(root: Path) -> Path:
    _image(root / "val2017" / "000000000001.jpg", (64, 48))
    _image(root / "val2017" / "000000000002.jpg", (40, 30))
    return _dump(
        root / "annotations" / "instances_val2017.json",
        {
            "info": {},
            "licenses": [],
            "images": [
                {"id": 1, "file_name": "000000000001.jpg", "width": 64, "height": 48},
                {"id": 2, "file_name": "000000000002.jpg", "width": 40, "height": 30},
            ],
            "categories": [
                {"id": 1, "name": "person", "supercategory": "person"},
                {"id": 18, "name": "dog", "supercategory": "animal"},
                {"id": 35, "name": "skis", "supercategory": "sports"},
            ],
            "annotations": [
                {
                    "id": 10,
                    "image_id": 1,
                    "category_id": 1,
                    "bbox": [2, 3, 10, 20],
                    "area": 200,
                    "iscrowd": 0,
                },
                {
                    "id": 11,
                    "image_id": 1,
                    "category_id": 1,
                    "bbox": [30.5, 4, 8.25, 12],
                    "area": 99,
                    "iscrowd": 0,
                },
                {
                    "id": 12,
                    "image_id": 1,
                    "category_id": 1,
                    "bbox": [0, 0, 64, 48],
                    "area": 3072,
                    "iscrowd": 1,
                },
                {
                    "id": 13,
                    "image_id": 1,
                    "category_id": 18,
                    "bbox": [40, 20, 20, 25],
                    "area": 500,
                    "iscrowd": 0,
                },
                {
                    "id": 14,
                    "image_id": 2,
                    "category_id": 35,
                    "bbox": [5, 6, 35.5, 10],
                    "area": 350,
                    "iscrowd": 0,
                },
                {"id": 15, "image_id": 2, "category_id": 35, "bbox": [7, 7, 0, 5], "area": 0, "iscrowd": 0},
            ],
        },
    )


def test_coco_groups_boxes_per_image_and_category_like_pycocotools(tmp_path):
    ann_file = _coco_fixture(tmp_path)
    path, records, counts = convert("coco", ann_file, tmp_path / "converted.jsonl")
    assert counts == {"crowd": 1, "empty_box": 1}
    back = read_records(path)
    assert back == records
    assert [r.id for r in back] == ["coco-1-1", "coco-1-18", "coco-2-35"]
    assert [r.prompt for r in back] == ["Find all the people.", "Find all the dogs.", "Find all the skis."]
    coco = COCO(str(ann_file))  # independent reference for grouping and xywh
    for rec in back:
        image_id, cat_id = rec.meta["image_id"], rec.meta["category_id"]
        info = coco.loadImgs(image_id)[0]
        expected = []
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id, catIds=cat_id, iscrowd=False)):
            x, y, w, h = ann["bbox"]
            if w > 0 and h > 0:
                expected.append([x, y, min(x + w, info["width"]), min(y + h, info["height"])])
        assert [[b.x1, b.y1, b.x2, b.y2] for b in rec.ground_truth.boxes] == expected
        assert (rec.width, rec.height, rec.split) == (info["width"], info["height"], "val")
        assert load_image(rec).size == (rec.width, rec.height)
    first_line = json.loads(path.read_text().splitlines()[0])
    assert first_line["image"] == "val2017/000000000001.jpg"  # inside the output folder: relative


def test_coco_errors_name_the_file_and_entry(tmp_path):
    ann_file = _coco_fixture(tmp_path)
    data = json.loads(ann_file.read_text())
    data["annotations"][3]["image_id"] = 99
    _dump(ann_file, data)
    with pytest.raises(
        ConvertError,
        match=r"instances_val2017\.json: annotations\[3\] \(id 13\): image_id 99 "
        r"is not in images",
    ):
        convert("coco", ann_file, tmp_path / "o.jsonl")
    data["annotations"][3]["image_id"] = 1
    data["annotations"][0]["bbox"] = [1, 2, 3]
    _dump(ann_file, data)
    with pytest.raises(ConvertError, match=r"annotations\[0\] \(id 10\): bbox must be \[x, y, w, h\]"):
        convert("coco", ann_file, tmp_path / "o.jsonl")
    moved = _dump(
        tmp_path / "x" / "elsewhere" / "instances_val2017.json",
        json.loads(_coco_fixture(tmp_path / "c2").read_text()),
    )
    with pytest.raises(ConvertError, match=r"image '000000000001\.jpg' not found under any of: .*elsewhere"):
        convert("coco", moved, tmp_path / "o.jsonl")
    path, _, _ = convert("coco", moved, tmp_path / "o.jsonl", image_root=tmp_path / "c2" / "val2017")
    assert len(read_records(path)) == 3


def test_plural_of_coco_names():
    assert [
        plural(n)
        for n in (
            "person",
            "bus",
            "wine glass",
            "toothbrush",
            "sheep",
            "teddy bear",
            "knife",
            "baseball bat",
            "hot dog",
            "pizza",
        )
    ] == [
        "people",
        "buses",
        "wine glasses",
        "toothbrushes",
        "sheep",
        "teddy bears",
        "knives",
        "baseball bats",
        "hot dogs",
        "pizzas",
    ]


# ---------------------------------------------------------------------------------------------- RefCOCO


def _refcoco_fixture(root: Path) -> Path:
    _image(root / "images" / "train2014" / "COCO_train2014_000000000009.jpg", (80, 60))
    _image(root / "images" / "train2014" / "COCO_train2014_000000000025.jpg", (50, 70))
    folder = root / "refcoco"
    _dump(
        folder / "instances.json",
        {
            "images": [
                {"id": 9, "file_name": "COCO_train2014_000000000009.jpg", "width": 80, "height": 60},
                {"id": 25, "file_name": "COCO_train2014_000000000025.jpg", "width": 50, "height": 70},
            ],
            "categories": [{"id": 1, "name": "person"}, {"id": 25, "name": "giraffe"}],
            "annotations": [
                {"id": 100, "image_id": 9, "category_id": 1, "bbox": [10, 12, 30, 40], "iscrowd": 0},
                {"id": 101, "image_id": 25, "category_id": 25, "bbox": [0, 5, 50, 60], "iscrowd": 0},
            ],
        },
    )
    _dump(
        folder / "refs(unc).json",
        [
            {
                "ref_id": 0,
                "ann_id": 100,
                "image_id": 9,
                "split": "train",
                "category_id": 1,
                "file_name": "COCO_train2014_000000000009_100.jpg",
                "sentences": [
                    {"sent_id": 0, "sent": "man on the left", "raw": "Man on the left", "tokens": []},
                    {"sent_id": 1, "sent": "guy in red", "raw": "guy in red.", "tokens": []},
                ],
            },
            {
                "ref_id": 1,
                "ann_id": 101,
                "image_id": 25,
                "split": "testA",
                "category_id": 25,
                "file_name": "COCO_train2014_000000000025_101.jpg",
                "sentences": [{"sent_id": 2, "sent": "tall giraffe", "raw": "tall giraffe", "tokens": []}],
            },
        ],
    )
    return folder


def test_refcoco_gives_one_record_per_sentence(tmp_path):
    folder = _refcoco_fixture(tmp_path)
    path, records, counts = convert("refcoco", folder, tmp_path / "out")
    assert path == tmp_path / "out" / "records.jsonl" and counts == {"refs": 2, "empty_box": 0}
    back = read_records(path)
    assert [(r.id, r.split, r.prompt) for r in back] == [
        ("refcoco-0-0", "train", 'Find "man on the left".'),
        ("refcoco-0-1", "train", 'Find "guy in red".'),
        ("refcoco-1-2", "testA", 'Find "tall giraffe".'),
    ]
    box = back[0].ground_truth.boxes[0]
    assert (box.x1, box.y1, box.x2, box.y2, box.label) == (10, 12, 40, 52, "person")
    assert back[2].ground_truth.boxes[0].y2 == 65 and (back[2].width, back[2].height) == (50, 70)
    assert all(load_image(r).size == (r.width, r.height) for r in back)


def test_refcoco_refuses_pickles_and_bad_refs(tmp_path):
    folder = _refcoco_fixture(tmp_path)
    refs = json.loads((folder / "refs(unc).json").read_text())
    (folder / "refs(unc).json").unlink()
    (folder / "refs(unc).p").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(ConvertError, match=r"found \['refs\(unc\)\.p'\]: pickles are not loaded"):
        convert("refcoco", folder, tmp_path / "o.jsonl")
    with pytest.raises(ConvertError, match="pickled refs are not loaded"):
        convert("refcoco", folder / "refs(unc).p", tmp_path / "o.jsonl")
    refs[1]["ann_id"] = 555
    _dump(folder / "refs(unc).json", refs)
    with pytest.raises(
        ConvertError, match=r"refs\(unc\)\.json: refs\[1\] \(ref_id 1\): ann_id 555 is not in"
    ):
        convert("refcoco", folder / "refs(unc).json", tmp_path / "o.jsonl")


# ---------------------------------------------------------------------------------------------- ShareRobot


def test_sharerobot_pixels_and_normalised_points(tmp_path):
    _image(tmp_path / "data" / "bridge" / "ep1" / "0.jpg", (64, 48))
    _image(tmp_path / "data" / "frames" / "b.png", (100, 50))
    src = _dump(
        tmp_path / "data" / "trajectory.json",
        [
            {
                "id": "bridge/ep1/0.jpg",
                "instruction": "reach for the carrot",
                "meta_data": {"original_dataset": "bridge", "original_width": 64, "original_height": 48},
                "points": [[10.5, 40.0], [20.0, 30.0], [64.4, 5.0]],
            },
            {
                "id": 7,
                "image": ["frames/b.png"],
                "instruction": " open the drawer ",
                "points": [[0.1, 0.2], [0.5, 0.5], [1.0, 1.0]],
            },
        ],
    )
    path, records, counts = convert("sharerobot", src, tmp_path / "out.jsonl")
    assert counts == {"normalised": 1, "pixels": 1}
    back = read_records(path)
    assert back[0].ground_truth == Trajectory(((10.5, 40.0), (20.0, 30.0), (64.0, 5.0)))  # 0.4 px clipped
    assert back[1].ground_truth == Trajectory(((10.0, 10.0), (50.0, 25.0), (100.0, 50.0)))
    assert (back[1].width, back[1].height, back[1].prompt) == (100, 50, "open the drawer")
    assert back[0].meta == {
        "source": "sharerobot",
        "source_id": "bridge/ep1/0.jpg",
        "normalised_input": False,
        "original_dataset": "bridge",
    }
    assert all(load_image(r).size == (r.width, r.height) for r in back)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"instruction": "x", "points": [[1, 1], [70, 1]]},
            r"entry 0 \(id a\.png\): point 1 \(70, 1\) is outside the 64x48",
        ),
        (
            {"instruction": "x", "points": [[1, 1]]},
            r"entry 0 \(id a\.png\): a trajectory needs at least 2 points",
        ),
        ({"instruction": "x", "points": [[1, "y"], [2, 2]]}, r"point 0 must be \[x, y\] with finite numbers"),
        ({"points": [[1, 1], [2, 2]]}, r"entry 0 \(id a\.png\): missing field 'instruction'"),
    ],
)
def test_sharerobot_errors_name_the_entry(tmp_path, entry, message):
    _image(tmp_path / "a.png", (64, 48))
    src = _dump(tmp_path / "t.json", [{"id": "a.png", **entry}])
    with pytest.raises(ConvertError, match=message):
        convert("sharerobot", src, tmp_path / "o.jsonl")


# ---------------------------------------------------------------------------------------------- RoboPoint


_ROBOPOINT_Q = (
    "<image>\nIn the image, there is an item encased within a red rectangle. Pinpoint several points "
    "within the vacant space situated to the left of the item. Your answer should be formatted as a "
    "list of tuples, i.e. [(x1, y1), (x2, y2), ...], where each tuple contains the x and y coordinates "
    "of a point satisfying the conditions above. The coordinates should be between 0 and 1, indicating "
    "the normalized pixel locations of the points in the image."
)


def test_robopoint_point_turns_become_affordance_points(tmp_path):
    _image(tmp_path / "region_ref" / "1.png", (200, 100))
    _image(tmp_path / "object_ref" / "2.png", (50, 50))
    src = _dump(
        tmp_path / "robopoint_1432k.json",
        [
            {
                "id": "region_ref_1",
                "image": "region_ref/1.png",
                "conversations": [
                    {"from": "human", "value": _ROBOPOINT_Q},
                    {"from": "gpt", "value": "[(0.25, 0.5), (0.75, 0.1)]"},
                    {"from": "human", "value": "What colour is the box?"},
                    {"from": "gpt", "value": "Red."},
                ],
            },
            {
                "id": "object_ref_2",
                "image": "object_ref/2.png",
                "conversations": [
                    {"from": "human", "value": "<image>\nFind the cup."},
                    {"from": "gpt", "value": "[(0.1, 0.1, 0.3, 0.4)]"},
                ],
            },
        ],
    )
    path, records, counts = convert("robopoint", src, tmp_path / "o.jsonl")
    assert counts == {"point_turns": 1, "other_turns": 2, "normalised": 1}
    (rec,) = read_records(path)
    assert rec.ground_truth == Points(((50.0, 50.0), (150.0, 10.0)))
    assert rec.prompt == (
        "In the image, there is an item encased within a red rectangle. Pinpoint several points "
        "within the vacant space situated to the left of the item."
    )
    assert (rec.id, rec.task, rec.width, rec.height) == ("robopoint-region_ref_1-0", "affordance", 200, 100)


def test_robopoint_answer_parsing():
    assert parse_point_answer(" [(0.5, 0.25), (1e-1,.3)] ") == [(0.5, 0.25), (0.1, 0.3)]
    assert parse_point_answer("[(12, 30)]") == [(12.0, 30.0)]
    for text in ("[]", "[(0.1, 0.2, 0.3, 0.4)]", "The cup.", "[(0.1, 0.2)] and more", "[(0.1 0.2)]"):
        assert parse_point_answer(text) is None, text


def test_robopoint_missing_image_names_the_entry(tmp_path):
    src = _dump(
        tmp_path / "r.json",
        [
            {
                "id": 5,
                "image": "nope.png",
                "conversations": [
                    {"from": "human", "value": "<image>\nq"},
                    {"from": "gpt", "value": "[(0.5, 0.5)]"},
                ],
            }
        ],
    )
    with pytest.raises(ConvertError, match=r"r\.json: entry 0 \(id 5\): .*nope\.png: image file not found"):
        convert("robopoint", src, tmp_path / "o.jsonl")


# ---------------------------------------------------------------------------------------------- Where2Place


def _where2place_fixture(root: Path) -> tuple[Path, np.ndarray]:
    _image(root / "images" / "00.jpg", (96, 64))
    mask = Image.new("L", (96, 64), 0)
    ImageDraw.Draw(mask).rectangle([20, 10, 59, 39], fill=255)
    (root / "masks").mkdir(parents=True)
    mask.save(root / "masks" / "00.jpg", quality=75)  # JPEG, as released: edges get compression noise
    expected = np.zeros((64, 96), bool)
    expected[10:40, 20:60] = True
    (root / "point_questions.jsonl").write_text(
        json.dumps(
            {
                "question_id": 0,
                "image": "00.jpg",
                "category": "placement",
                "text": "Please point out the free space between the bowls. Your answer should be formatted as a list "
                "of tuples, i.e. [(x1, y1), (x2, y2), ...].",
            }
        )
        + "\n"
    )
    return root, expected


def test_where2place_masks_are_binarised_pngs(tmp_path):
    folder, expected = _where2place_fixture(tmp_path / "where2place")
    rc = cli_main(["convert", "--from", "where2place", str(folder), str(tmp_path / "out")])
    assert rc == 0
    (rec,) = read_records(tmp_path / "out" / "records.jsonl")
    assert isinstance(rec.ground_truth, MaskRef) and rec.ground_truth.path.endswith(".png")
    assert Path(rec.ground_truth.path).parent == tmp_path / "out" / "masks"
    mask = load_mask(rec)
    with Image.open(rec.ground_truth.path) as written:
        assert written.mode == "L" and set(np.unique(np.asarray(written))) <= {0, 255}
    assert (mask == expected).mean() > 0.99 and mask[12:38, 22:58].all() and not mask[:5].any()
    assert (rec.split, rec.prompt) == ("test", "Please point out the free space between the bowls.")


def test_where2place_mask_size_mismatch_is_named(tmp_path):
    folder, _ = _where2place_fixture(tmp_path / "w")
    Image.new("L", (10, 10), 255).save(folder / "masks" / "00.png")  # .png wins over .jpg
    with pytest.raises(
        ConvertError,
        match=r"point_questions\.jsonl:1 \(question_id 0\): mask is 10x10 but the "
        r"image is 96x64",
    ):
        convert("where2place", folder, tmp_path / "o")


# ---------------------------------------------------------------------------------------------- CLI


def test_convert_cli_reports_and_fails_with_one_line(tmp_path, capsys):
    ann_file = _coco_fixture(tmp_path)
    assert cli_main(["convert", "--from", "coco", str(ann_file), str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "wrote 3 detection records from coco" in out and "crowd=1, empty_box=1" in out
    assert (
        cli_main(["convert", "--from", "sharerobot", str(tmp_path / "missing.json"), str(tmp_path / "o")])
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vlm-grpoma convert: error: {tmp_path / 'missing.json'}: input not found"]


def test_llava_multi_image_entries_become_history_frame_records(tmp_path):
    """LLaVA's multi-image form: the frames in order, the points in the last one (the target)."""
    for i, size in enumerate([(80, 60), (80, 60), (200, 100)]):
        _image(tmp_path / "frames" / f"{i}.png", size)
    frames = [f"frames/{i}.png" for i in range(3)]
    question = "<image>\n<image>\n<image>\nPoint to the free space left of the cup."
    entry = {
        "id": "h1",
        "image": frames,
        "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "[(0.5, 0.5)]"}],
    }
    path, _, _ = convert("robopoint", _dump(tmp_path / "h.json", [entry]), tmp_path / "o.jsonl")
    (record,) = read_records(path, check_images=True)
    assert record.images == tuple(str(tmp_path / f) for f in frames) and record.target_image == 2
    assert (record.width, record.height) == (200, 100) and record.ground_truth == Points(((100.0, 50.0),))
    assert record.prompt == "Point to the free space left of the cup."
    wrong = entry | {"image": frames[:2]}
    with pytest.raises(ConvertError, match=r"entry 0 \(id h1\): 2 images but 3 <image> placeholders"):
        convert("robopoint", _dump(tmp_path / "w.json", [wrong]), tmp_path / "w.jsonl")
