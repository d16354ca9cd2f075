"""``convert --from parquet`` on lmms-lab/RefCOCO's column layout (from its dataset card: ``question_id``,
``image``, ``question``, ``answer`` as a list of strings, ``segmentation``, ``bbox`` as COCO ``[x, y, w, h]``,
``iscrowd``, ``file_name``; shards ``data/{val,testA}-…``): the data guide's command gives one record per referring
expression, the wrong mapping warns, and ids that sanitise alike keep their own images (#36 M8)."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
from PIL import Image

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.converters import convert
from vlm_grpoma.datasets.images import load_image
from vlm_grpoma.datasets.jsonl import read_records

DATA_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "data.md"
INSTRUCTION = (
    "Please carefully observe the area circled in the image and come up with a caption for the area."
)


def _png(colour, size=(64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _lmms_refcoco(folder: Path, shards: dict[str, list[tuple]]) -> Path:
    """rows: (question_id, colour, expressions, bbox xywh)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    schema = pa.schema(
        [
            ("question_id", pa.string()),
            ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("question", pa.string()),
            ("answer", pa.list_(pa.string())),
            ("segmentation", pa.list_(pa.float32())),
            ("bbox", pa.list_(pa.float32())),
            ("iscrowd", pa.int8()),
            ("file_name", pa.string()),
        ]
    )
    (folder / "data").mkdir(parents=True)
    for split, rows in shards.items():
        table = pa.table(
            {
                "question_id": [r[0] for r in rows],
                "image": [{"bytes": _png(r[1]), "path": None} for r in rows],
                "question": [INSTRUCTION] * len(rows),
                "answer": [r[2] for r in rows],
                "segmentation": [[1.0, 1.0, 5.0, 1.0, 5.0, 5.0] for _ in rows],
                "bbox": [r[3] for r in rows],
                "iscrowd": [0] * len(rows),
                "file_name": [f"COCO_train2014_{i:012d}.jpg" for i, _ in enumerate(rows)],
            },
            schema=schema,
        )
        pq.write_table(table, folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def _readme_command() -> list[str]:
    """The data guide's lmms-lab/RefCOCO convert command, as the shell would split it."""
    text = DATA_GUIDE.read_text(encoding="utf-8")
    match = re.search(r"vlm-grpoma (convert --from parquet data/hf/RefCOCO .*?--box-format xywh)", text, re.S)
    assert match, "the data guide's Hugging Face RefCOCO example is gone"
    return shlex.split(match.group(1).replace("\\\n", " "))


def test_the_data_guides_command_gives_one_record_per_expression(tmp_path, caplog):
    hub = _lmms_refcoco(
        tmp_path / "RefCOCO",
        {
            "val": [("1", "red", ["man on the left", "left guy"], [2.0, 3.0, 10.0, 20.0])],
            "testA": [("2", "blue", ["woman in blue"], [0.0, 0.0, 40.0, 30.0])],
        },
    )
    argv = _readme_command()
    assert argv[3:5] == ["data/hf/RefCOCO", "data/refcoco-hf"]
    argv[3:5] = [str(hub), str(tmp_path / "out")]
    assert cli_main(argv) == 0
    records = {r.id: r for r in read_records(tmp_path / "out" / "records.jsonl")}
    assert sorted(records) == ["1-0", "1-1", "2-0"]
    assert [records[i].prompt for i in ("1-0", "1-1")] == ["man on the left", "left guy"]
    assert records["2-0"].split == "testA" and records["1-0"].split == "val"
    box = records["1-1"].ground_truth.boxes[0]
    assert (box.x1, box.y1, box.x2, box.y2) == (2.0, 3.0, 12.0, 23.0)  # COCO xywh -> corners
    assert records["1-0"].image == records["1-1"].image  # one image file for the row's expressions
    assert "same prompt" not in caplog.text


def test_the_instruction_column_as_prompt_warns(tmp_path, caplog):
    hub = _lmms_refcoco(
        tmp_path / "RefCOCO",
        {"val": [("1", "red", ["a"], [2.0, 3.0, 10.0, 20.0]), ("2", "red", ["b"], [1.0, 1.0, 5.0, 5.0])]},
    )
    fields = {"prompt": "question", "boxes": "bbox", "id": "question_id"}
    convert("parquet", hub, tmp_path / "out", task="detection", fields=fields, box_format="xywh")
    [warning] = [r.getMessage() for r in caplog.records if "same prompt" in r.getMessage()]
    assert warning.startswith(
        f"every one of the 2 records has the same prompt {INSTRUCTION[:80]!r} (column question)"
    )


def test_ids_that_sanitise_alike_keep_their_own_images(tmp_path):
    """#36 M8: ``cat/1`` and ``cat_1`` both sanitise to ``cat_1``; each record must still get its image."""
    hub = _lmms_refcoco(
        tmp_path / "RefCOCO",
        {
            "val": [
                ("cat/1", "red", ["x"], [2.0, 3.0, 10.0, 20.0]),
                ("cat_1", "blue", ["y"], [2.0, 3.0, 10.0, 20.0]),
            ]
        },
    )
    fields = {"prompt": "answer", "boxes": "bbox", "id": "question_id"}
    path, _, _ = convert("parquet", hub, tmp_path / "out", task="detection", fields=fields, box_format="xywh")
    records = {r.id: r for r in read_records(path)}
    assert records["cat/1-0"].image != records["cat_1-0"].image
    assert load_image(records["cat/1-0"]).getpixel((0, 0)) == (255, 0, 0)
    assert load_image(records["cat_1-0"]).getpixel((0, 0)) == (0, 0, 255)
    assert len(list((tmp_path / "out" / "images").iterdir())) == 2


def test_an_empty_expression_list_names_the_row(tmp_path):
    from vlm_grpoma.datasets.converters.common import ConvertError

    hub = _lmms_refcoco(tmp_path / "RefCOCO", {"val": [("7", "red", [], [2.0, 3.0, 10.0, 20.0])]})
    fields = {"prompt": "answer", "boxes": "bbox", "id": "question_id"}
    with pytest.raises(
        ConvertError, match=r"val-00000-of-00001\.parquet: row 0 \(id 7\): the prompt list is empty"
    ):
        convert("parquet", hub, tmp_path / "out", task="detection", fields=fields, box_format="xywh")
