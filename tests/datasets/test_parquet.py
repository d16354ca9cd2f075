"""``convert --from parquet``: hub-style parquet shards (embedded image bytes) and plain tables (image paths),
columns named with --field, splits from shard names, normalised and COCO-style boxes, clear errors."""

from __future__ import annotations

import io
import sys

import pytest
from PIL import Image

from vlm_grpoma.answers import Points
from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.converters import convert
from vlm_grpoma.datasets.converters.common import ConvertError
from vlm_grpoma.datasets.converters.parquet import split_of_file
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.errors import MissingDependencyError


def png_bytes(size, colour) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def pq():
    return pytest.importorskip("pyarrow.parquet", reason="pyarrow is the optional [parquet] extra")


@pytest.fixture
def hub_refcoco(tmp_path, pq):
    """A hub download: data/{val,testA}-00000-of-00001.parquet with an Image column and COCO [x, y, w, h]."""
    import pyarrow as pa

    def shard(split, rows):
        table = pa.table(
            {
                "question_id": [r[0] for r in rows],
                "image": [{"bytes": png_bytes(r[1], r[2]), "path": None} for r in rows],
                "question": [r[3] for r in rows],
                "bbox": [r[4] for r in rows],
            }
        )
        (tmp_path / "hub" / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp_path / "hub" / "data" / f"{split}-00000-of-00001.parquet")

    shard("val", [("q1", (64, 48), "red", "the man on the left", [2.0, 3.0, 10.0, 20.0])])
    shard(
        "testA",
        [
            ("q2", (40, 30), "blue", "woman in blue", "[0, 0, 40, 30.5]"),  # 0.5 px over: clipped
            ("q3", (40, 30), "green", "the dog", '[{"bbox_2d": [5, 5, 10, 10], "label": "dog"}]'),
        ],
    )
    return tmp_path / "hub"


def test_hub_shards_become_records_per_split_with_images_written_out(hub_refcoco, tmp_path):
    out = tmp_path / "out"
    path, records, counts = convert(
        "parquet",
        hub_refcoco,
        out,
        task="detection",
        fields={"prompt": "question", "boxes": "bbox", "id": "question_id"},
        box_format="xywh",
    )
    assert path == out / "records.jsonl" and counts == {"rows": 3, "normalised": 0}
    by_id = {r.id: r for r in read_records(path)}
    assert [by_id[i].split for i in ("q1", "q2", "q3")] == ["val", "testA", "testA"]
    q1 = by_id["q1"].ground_truth.boxes[0]
    assert (q1.x1, q1.y1, q1.x2, q1.y2) == (2.0, 3.0, 12.0, 23.0)  # x, y, w, h -> corners
    q2 = by_id["q2"].ground_truth.boxes[0]
    assert (q2.x2, q2.y2) == (40.0, 30.0)
    assert by_id["q3"].ground_truth.boxes[0].label == "dog" and by_id["q3"].prompt == "the dog"
    image = load_image(by_id["q1"])  # the embedded bytes were written beside the records, and decode
    assert image.size == (64, 48) and image.getpixel((0, 0)) == (255, 0, 0)
    assert by_id["q1"].image.startswith(str(out / "images"))


def test_plain_table_with_paths_normalised_points_and_a_split_column(tmp_path, pq):
    import pyarrow as pa

    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (100, 50)).save(tmp_path / "imgs" / "a.jpg")
    table = pa.table(
        {
            "file": ["a.jpg", "a.jpg"],
            "instruction": ["grasp the handle.", "touch the lid"],
            "where": [[[0.5, 0.5]], [[10.0, 20.0], [30.0, 40.0]]],
            "part": ["train", "test"],
        }
    )
    pq.write_table(table, tmp_path / "table.parquet")
    fields = ["prompt=instruction", "points=where", "image=file", "split=part"]
    argv = ["convert", "--from", "parquet", str(tmp_path / "table.parquet"), str(tmp_path / "out.jsonl")]
    argv += ["--task", "affordance", "--image-root", str(tmp_path / "imgs")]
    assert cli_main(argv + [arg for f in fields for arg in ("--field", f)]) == 0
    records = read_records(tmp_path / "out.jsonl")
    assert [r.split for r in records] == ["train", "test"]
    assert records[0].ground_truth == Points(((50.0, 25.0),))  # fractions of 100 x 50
    assert records[1].ground_truth == Points(((10.0, 20.0), (30.0, 40.0)))
    assert records[0].id == "table-000000" and records[0].width == 100


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "question"}, r"--field: detection needs prompt=COLUMN and one of boxes=COLUMN"),
        ({"prompt": "question", "boxes": "nope"}, r"no column for --field boxes=nope; columns: question_id"),
        ({"prompt": "question", "boxes": "bbox", "colour": "x"}, r"--field colour: unknown"),
    ],
)
def test_mapping_errors_name_the_field_and_columns(hub_refcoco, tmp_path, fields, message):
    with pytest.raises(ConvertError, match=message):
        convert("parquet", hub_refcoco, tmp_path / "o", task="detection", fields=fields)


def test_a_bad_value_names_the_file_and_row(tmp_path, pq):
    import pyarrow as pa

    Image.new("RGB", (10, 10)).save(tmp_path / "x.png")
    pq.write_table(
        pa.table({"image": ["x.png", "x.png"], "p": ["a", "b"], "b": ["[1, 1, 5, 5]", "[1, 1, 50, 5]"]}),
        tmp_path / "t.parquet",
    )
    with pytest.raises(
        ConvertError, match=r"t\.parquet: row 1 \(id t-000001\): point 1 \(50, 5\) is outside"
    ):
        convert(
            "parquet",
            tmp_path / "t.parquet",
            tmp_path / "o",
            task="detection",
            fields={"prompt": "p", "boxes": "b"},
        )


def test_column_options_are_refused_for_other_formats(tmp_path):
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(ConvertError, match="apply to --from parquet, gsm8k, math only"):
        convert("coco", tmp_path / "x.json", tmp_path / "o", task="detection")


def test_without_pyarrow_the_error_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails as if not installed
    (tmp_path / "t.parquet").write_bytes(b"")
    with pytest.raises(MissingDependencyError, match=r"needs pyarrow: pip install pyarrow$"):
        convert("parquet", tmp_path / "t.parquet", tmp_path / "o", task="detection", fields={"prompt": "p"})


def test_split_names_of_hub_shards():
    from pathlib import Path

    assert split_of_file(Path("data/testB-00003-of-00004.parquet")) == "testB"
    assert split_of_file(Path("validation-00000-of-00001.parquet")) == "validation"
    assert split_of_file(Path("mine.parquet")) == "train"


def test_a_list_column_of_images_gives_multi_image_records(tmp_path, pq):
    """A hub ``Sequence(Image)`` column (embedded views) with a target column, and a list of paths."""
    import pyarrow as pa

    table = pa.table(
        {
            "views": [
                [{"bytes": png_bytes((40, 30), "red"), "path": None}, {"bytes": png_bytes((64, 48), "blue")}],
            ],
            "which": [1],
            "instruction": ["the handle"],
            "where": [[[32.0, 24.0]]],
        }
    )
    pq.write_table(table, tmp_path / "views.parquet")
    fields = {"images": "views", "target_image": "which", "prompt": "instruction", "points": "where"}
    path, _, _ = convert(
        "parquet", tmp_path / "views.parquet", tmp_path / "out", task="affordance", fields=fields
    )
    (record,) = read_records(path, check_images=True)
    assert len(record.images) == 2 and record.target_image == 1 and (record.width, record.height) == (64, 48)
    assert [load_image(p, "x").getpixel((0, 0)) for p in record.images] == [(255, 0, 0), (0, 0, 255)]
    assert record.ground_truth == Points(((32.0, 24.0),))  # in the target's 64 x 48 pixels, not fractions


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image": "views", "images": "views"}, "give image=COLUMN .* or images=COLUMN .*, not both"),
        ({"target_image": "which"}, "target_image=COLUMN names one of images=COLUMN"),
        (
            {"images": "views", "target_image": "which"},
            r"row 0 \(id views-000000\): target_image must index the row's 2 images, got 2",
        ),
        (
            {"images": "empty"},
            r"row 0 \(id views-000000\): column 'empty' \(images\) must be a non-empty list",
        ),
    ],
)
def test_multi_image_columns_are_checked_per_row(tmp_path, pq, fields, message):
    import pyarrow as pa

    Image.new("RGB", (10, 10)).save(tmp_path / "a.png")
    table = pa.table(
        {"views": [["a.png", "a.png"]], "empty": [[]], "which": [2], "q": ["x"], "p": [[[1.0, 1.0]]]}
    )
    pq.write_table(table, tmp_path / "views.parquet")
    with pytest.raises(ConvertError, match=message):
        convert(
            "parquet",
            tmp_path / "views.parquet",
            tmp_path / "out",
            task="affordance",
            fields={"prompt": "q", "points": "p", **fields},
        )
