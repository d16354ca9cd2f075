"""Short-answer records (task ``answer``): text-only and with an image, round trip through JSONL, and one-line
errors naming file:line and the key for every malformed ground truth or size field."""

from __future__ import annotations

import json

import pytest

from vlm_grpoma.datasets.check import check_record_files
from vlm_grpoma.datasets.images import image_problems
from vlm_grpoma.datasets.jsonl import load_records, read_records, write_records
from vlm_grpoma.datasets.schema import Record, ShortAnswer


def _write_lines(path, *objs) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")


def _answer(**overrides) -> dict:
    obj = {"id": "a0", "task": "answer", "prompt": "2+3?", "ground_truth": {"answer": "5"}, "split": "train"}
    return {**obj, **overrides}


def test_text_only_record_has_no_image_and_round_trips(tmp_path):
    gt = {"answer": "0.5", "matcher": "numeric", "tolerance": 0.01}
    _write_lines(tmp_path / "r.jsonl", _answer(ground_truth=gt, meta={"thought": "1/2"}))
    (record,) = read_records(tmp_path / "r.jsonl")
    assert record.image is None and record.width is None and record.height is None and record.text_only
    assert record.ground_truth == ShortAnswer("0.5", "numeric", 0.01)
    out = write_records(tmp_path / "out" / "r.jsonl", [record])
    written = json.loads(out.read_text(encoding="utf-8"))
    assert "image" not in written and "width" not in written and written["ground_truth"] == gt
    assert read_records(out) == [record]


def test_answer_record_may_carry_an_image(tmp_path):
    _write_lines(tmp_path / "r.jsonl", _answer(image="img/x.png", width=32, height=16))
    (record,) = read_records(tmp_path / "r.jsonl")
    assert record.image == str(tmp_path / "img" / "x.png") and (record.width, record.height) == (32, 16)
    assert record.ground_truth == ShortAnswer("5") and not record.text_only


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ground_truth": {"answer": ""}}, "ground_truth.answer: must be a non-empty string"),
        ({"ground_truth": {"answer": 5}}, "ground_truth.answer: must be a non-empty string"),
        ({"ground_truth": {"answer": "5", "matcher": "fuzzy"}}, "ground_truth.matcher: must be one of"),
        ({"ground_truth": {"answer": "5", "tolerance": -1}}, "ground_truth.tolerance: must be >= 0"),
        ({"ground_truth": {"answer": "5", "boxes": []}}, "ground_truth.boxes: unknown key"),
        ({"width": 32, "height": 32}, "width: a text-only record"),
        ({"image": "x.png"}, "width: required field is missing"),
    ],
)
def test_bad_answer_records_name_file_line_and_key(tmp_path, overrides, message):
    _write_lines(tmp_path / "r.jsonl", _answer(id="ok"), _answer(id="bad", **overrides))
    report = load_records(tmp_path / "r.jsonl")
    assert [r.id for r in report.records] == ["ok"]
    (error,) = report.errors
    assert "r.jsonl:2 (id bad)" in str(error) and message in str(error)


def test_a_visual_task_still_needs_its_image(tmp_path):
    obj = {"id": "d", "task": "detection", "prompt": "x", "ground_truth": {"boxes": []}}
    _write_lines(tmp_path / "r.jsonl", obj)
    (error,) = load_records(tmp_path / "r.jsonl").errors
    assert "image: required field is missing" in str(error)


def test_record_dataclass_accepts_text_only():
    assert Record("i", None, "answer", "p", None, None, ShortAnswer("1")).text_only


def test_file_checks_never_open_a_file_for_a_text_only_record(tmp_path):
    record = Record("t", None, "answer", "2+3?", None, None, ShortAnswer("5"))
    with_image = Record("i", str(tmp_path / "missing.png"), "answer", "p", 8, 8, ShortAnswer("5"))
    check_record_files(record)
    problems = image_problems([record, with_image])
    assert list(problems) == [1] and "missing.png" in problems[1]
