"""JSONL records: round trips, one specific message per kind of bad line, skip_bad, path handling."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from vlm_grpoma.answers import Box, Boxes, ContactAction, Points, Trajectory
from vlm_grpoma.datasets.jsonl import RecordError, load_records, read_records, write_records
from vlm_grpoma.datasets.schema import MaskRef, Record


def _good(**overrides) -> dict:
    obj = {
        "id": "r1",
        "image": "images/a.png",
        "task": "detection",
        "prompt": "Find the red square.",
        "width": 100,
        "height": 50,
        "split": "train",
        "ground_truth": {"boxes": [{"bbox_2d": [10, 5, 40, 30], "label": "red square"}]},
        "meta": {"k": 1},
    }
    obj.update(overrides)
    return obj


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _records(tmp_path: Path) -> list[Record]:
    img = str(tmp_path / "images" / "a.png")
    return [
        Record(
            "d",
            img,
            "detection",
            "Find all.",
            100,
            50,
            Boxes((Box(1, 2, 30, 40, "a"), Box(50.5, 0, 100, 50, "b"))),
            "val",
            {"nested": {"x": [1, 2]}},
        ),
        Record("a-mask", img, "affordance", "Point.", 100, 50, MaskRef(str(tmp_path / "masks" / "m.png"))),
        Record("a-pts", img, "affordance", "Point.", 100, 50, Points(((0, 0), (100, 50)))),
        Record("t", img, "trajectory", "Go.", 100, 50, Trajectory(((1.5, 2.5), (3, 4), (99.9, 49.9)))),
        Record(
            "m",
            "/elsewhere/x.png",
            "manipulation",
            "Pull.",
            100,
            50,
            ContactAction((10, 20), (0.0, 0.0, 1.0), (1.0, 0.0, 0.0)),
        ),
    ]


def test_write_read_round_trip_keeps_every_field(tmp_path):
    records = _records(tmp_path)
    path = write_records(tmp_path / "out" / ".." / "records.jsonl", records)
    assert read_records(path) == records


def test_unicode_and_line_separators_inside_strings_survive(tmp_path):
    rec = Record(
        "u",
        str(tmp_path / "a.png"),
        "detection",
        "Finde den Würfel\u2028— 立方体",
        10,
        10,
        Boxes((Box(0, 0, 5, 5, "wür\u2029fel"),)),
    )
    path = write_records(tmp_path / "r.jsonl", [rec])
    assert read_records(path) == [rec]
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))  # BOM + CRLF (Windows)
    assert read_records(path) == [rec]


def test_paths_are_relative_on_disk_and_resolved_against_the_file_folder(tmp_path, monkeypatch):
    records = _records(tmp_path)
    path = write_records(tmp_path / "records.jsonl", records)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["image"] == "images/a.png"
    assert lines[1]["ground_truth"] == {"mask": "masks/m.png"}
    assert lines[4]["image"] == "/elsewhere/x.png"  # outside the folder: stays absolute
    monkeypatch.chdir("/")  # resolution must not depend on the working directory
    back = read_records(os.path.relpath(path, "/"))
    assert back[0].image == str(tmp_path / "images" / "a.png")
    assert back[1].ground_truth == MaskRef(str(tmp_path / "masks" / "m.png"))


def test_relative_in_memory_paths_are_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = Record("x", "data/images/a.png", "detection", "p", 10, 10, Boxes((Box(0, 0, 5, 5),)))
    path = write_records(Path("data/records.jsonl"), [rec])
    assert json.loads(path.read_text())["image"] == "images/a.png"


def test_write_is_atomic_and_validates_before_touching_the_file(tmp_path):
    path = write_records(tmp_path / "r.jsonl", _records(tmp_path))
    before = path.read_bytes()
    bad = Record("bad", "a.png", "detection", "p", 10, 10, Boxes((Box(5, 0, 2, 5),)))
    with pytest.raises(
        RecordError,
        match=r"record 1 \(id bad\): ground_truth.boxes\[0\].bbox_2d: x2 \(2\) must be > x1 \(5\)",
    ):
        write_records(path, [_records(tmp_path)[0], bad])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]  # no temp file left behind
    dup = _records(tmp_path)[0]
    with pytest.raises(RecordError, match="duplicate id"):
        write_records(path, [dup, dup])


def test_written_output_is_deterministic(tmp_path):
    a = write_records(tmp_path / "a.jsonl", _records(tmp_path)).read_bytes()
    b = write_records(tmp_path / "b.jsonl", _records(tmp_path)).read_bytes()
    assert a == b


BAD_LINES = [
    ("{not json", r"t\.jsonl:2: invalid JSON: "),
    ("[1, 2]", r"t\.jsonl:2: record: must be a JSON object, got list"),
    (
        json.dumps({k: v for k, v in _good().items() if k != "prompt"}),
        r":2 \(id r1\): prompt: required field is missing",
    ),
    (json.dumps(_good(colour="red")), r"\(id r1\): colour: unknown field"),
    (json.dumps(_good(id="")), r"t\.jsonl:2: id: must be a non-empty string"),
    (json.dumps(_good(id=7)), r"t\.jsonl:2: id: must be a non-empty string, got 7"),
    (json.dumps(_good(task="segmentation")), r"\(id r1\): task: must be one of .*got \"segmentation\""),
    (json.dumps(_good(width=0)), r"\(id r1\): width: must be a positive integer, got 0"),
    (json.dumps(_good(height=50.0)), r"\(id r1\): height: must be a positive integer, got 50.0"),
    (json.dumps(_good(width=True)), r"\(id r1\): width: must be a positive integer, got true"),
    (json.dumps(_good(meta=[1])), r"\(id r1\): meta: must be an object"),
    (json.dumps(_good(split=3)), r"\(id r1\): split: must be a non-empty string"),
    (json.dumps(_good(ground_truth=[])), r"\(id r1\): ground_truth: must be an object"),
    (
        json.dumps(_good(ground_truth={"points": [[1, 1]]})),
        r"\(id r1\): ground_truth: task 'detection' takes boxes, not 'points'",
    ),
    (json.dumps(_good(ground_truth={"boxes": [], "points": []})), r"ground_truth: must have exactly one key"),
    (json.dumps(_good(ground_truth={"boxes": []})), r"ground_truth.boxes: needs at least 1 item"),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [40, 5, 10, 30]}]})),
        r"t\.jsonl:2 \(id r1\): ground_truth\.boxes\[0\]\.bbox_2d: x2 \(10\) must be > x1 \(40\)",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [1, 30, 10, 30]}]})),
        r"ground_truth\.boxes\[0\]\.bbox_2d: y2 \(30\) must be > y1 \(30\)",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [10, 5, 101, 30]}]})),
        r"ground_truth\.boxes\[0\]\.bbox_2d: box \[10, 5, 101, 30\] is outside the image \[0, 100\] x \[0, 50\]",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [10, 5, 20]}]})),
        r"ground_truth\.boxes\[0\]\.bbox_2d: must be a list \[x1, y1, x2, y2\]",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [10, "5", 20, 30]}]})),
        r"ground_truth\.boxes\[0\]\.bbox_2d\[1\]: must be a number, got \"5\"",
    ),
    (
        '{"id": "r1", "image": "a.png", "task": "detection", "prompt": "p", "width": 100, "height": 50, '
        '"ground_truth": {"boxes": [{"bbox_2d": [NaN, 5, 20, 30]}]}}',
        r"ground_truth\.boxes\[0\]\.bbox_2d\[0\]: must be finite, got nan",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [1, 5, 20, 30], "label": 3}]})),
        r"ground_truth\.boxes\[0\]\.label: must be a string",
    ),
    (
        json.dumps(_good(ground_truth={"boxes": [{"bbox_2d": [1, 5, 20, 30], "score": 1}]})),
        r"ground_truth\.boxes\[0\]: unknown key\(s\) \['score'\]",
    ),
    (
        json.dumps(_good(task="affordance", ground_truth={"points": [[5, 5], [101, 5]]})),
        r"ground_truth\.points\[1\]: point \(101, 5\) is outside the image",
    ),
    (
        json.dumps(_good(task="affordance", ground_truth={"points": [[5, 5, 5]]})),
        r"ground_truth\.points\[0\]: must be a list \[x, y\]",
    ),
    (
        json.dumps(_good(task="affordance", ground_truth={"mask": ""})),
        r"ground_truth\.mask: must be a non-empty path",
    ),
    (
        json.dumps(_good(task="affordance", ground_truth={"trajectory": [[1, 1], [2, 2]]})),
        r"task 'affordance' takes mask or boxes or points, not 'trajectory'",
    ),
    (
        json.dumps(_good(task="trajectory", ground_truth={"trajectory": [[1, 1]]})),
        r"ground_truth\.trajectory: needs at least 2 item\(s\), got 1",
    ),
    (
        json.dumps(_good(task="trajectory", ground_truth={"trajectory": [[1, 1], [2, -0.5]]})),
        r"ground_truth\.trajectory\[1\]: point \(2, -0.5\) is outside the image",
    ),
    (
        json.dumps(
            _good(task="manipulation", ground_truth={"contact_action": {"point_2d": [1, 1], "up": [0, 0, 1]}})
        ),
        r"ground_truth\.contact_action: must be an object with exactly",
    ),
    (
        json.dumps(
            _good(
                task="manipulation",
                ground_truth={"contact_action": {"point_2d": [1, 1], "up": [0, 0, 0], "forward": [1, 0, 0]}},
            )
        ),
        r"ground_truth\.contact_action\.up: must be a non-zero direction",
    ),
    (
        json.dumps(
            _good(
                task="manipulation",
                ground_truth={"contact_action": {"point_2d": [1, 1], "up": [0, 0, 1], "forward": [1, 0]}},
            )
        ),
        r"ground_truth\.contact_action\.forward: must be a list \[x, y, z\]",
    ),
    (
        json.dumps(_good(task="manipulation", ground_truth={"boxes": [{"bbox_2d": [1, 1, 2, 2]}]})),
        r"task 'manipulation' takes contact_action, not 'boxes'",
    ),
    (json.dumps(_good()), r"t\.jsonl:2 \(id r1\): id: duplicate id, first used on line 1"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m[:40] for _, m in BAD_LINES])
def test_each_bad_line_raises_a_specific_message(tmp_path, line, message):
    first = json.dumps(_good(id="r1" if "duplicate" in message else "r0"))
    path = _write_lines(tmp_path / "t.jsonl", [first, line])
    with pytest.raises(RecordError, match=message):
        read_records(path)


def test_missing_file_is_a_record_error(tmp_path):
    with pytest.raises(RecordError, match=r"nope\.jsonl: records file not found"):
        read_records(tmp_path / "nope.jsonl")


def test_skip_bad_keeps_good_lines_counts_bad_ones_and_warns(tmp_path, caplog):
    lines = [
        json.dumps(_good(id="a")),
        "{oops",
        "",
        json.dumps(_good(id="b", width=-1)),
        json.dumps(_good(id="c")),
        json.dumps(_good(id="a")),
    ]
    path = _write_lines(tmp_path / "t.jsonl", lines)
    with pytest.raises(RecordError, match=r"t\.jsonl:2: invalid JSON"):
        read_records(path)
    with caplog.at_level(logging.WARNING):
        records = read_records(path, skip_bad=True)
    assert [r.id for r in records] == ["a", "c"]
    assert "skipped 3 bad line(s) of 5" in caplog.text
    report = load_records(path)
    assert report.skipped == 3
    assert [str(e).split(": ")[0] for e in report.errors] == [
        f"{path}:2",
        f"{path}:4 (id b)",
        f"{path}:6 (id a)",
    ]


def test_a_line_beyond_the_length_cap_is_one_error_and_the_rest_still_load(tmp_path):
    """Before: the whole file was read into memory at once, however long a line; now a line of more than
    MAX_LINE_CHARS is skipped unheld, named, and the lines after it load."""
    from vlm_grpoma.datasets.jsonl import MAX_LINE_CHARS

    first, last = json.dumps(_good(id="a")), json.dumps(_good(id="b"))
    path = tmp_path / "r.jsonl"
    path.write_text(first + "\n" + "x" * (MAX_LINE_CHARS + 10) + "\n" + last + "\n", encoding="utf-8")
    report = load_records(path)
    assert [r.id for r in report.records] == ["a", "b"] and report.lines == [1, 3]
    (error,) = report.errors
    assert str(error) == f"{path}:2: longer than {MAX_LINE_CHARS} characters; not read"


def test_with_an_image_root_every_image_and_mask_must_lie_under_it(tmp_path):
    """data.image_root: a records file from elsewhere naming ../../etc/shadow or a symlink out is refused by
    record (before: any path was read)."""
    root = tmp_path / "images"
    root.mkdir()
    (root / "link.png").symlink_to(tmp_path / "elsewhere.png")
    records = [
        _good(id="inside", image="images/a.png"),
        _good(id="dotdot", image="images/../../outside.png"),
        _good(id="link", image="images/link.png"),
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    kept = read_records(path, skip_bad=True, image_root=root)
    assert [r.id for r in kept] == ["inside"]
    with pytest.raises(
        RecordError, match=r"r.jsonl:2 \(id dotdot\): .*outside.png is outside data.image_root"
    ):
        read_records(path, image_root=root)
    assert len(read_records(path)) == 3  # without a root: anywhere
