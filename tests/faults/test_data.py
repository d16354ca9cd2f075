"""Hostile and broken data: found when the records are loaded, one line naming the file, line and record;
``data.skip_bad_records`` leaves such records out; nothing reaches the model or runs out of memory."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from pathlib import Path

import pytest
from fault_runs import error_lines
from PIL import Image

from vlm_grpoma import cli
from vlm_grpoma.datasets import images
from vlm_grpoma.datasets.jsonl import RecordError, read_records, write_records
from vlm_grpoma.errors import CommandError, DataError
from vlm_grpoma.models.record_checks import prompt_problems
from vlm_grpoma.models.registry import load_adapter
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Image-check results go to this test's own cache folder."""
    monkeypatch.setenv("VLM_GRPOMA_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model would be loaded: the data checks must come first."""
    monkeypatch.setattr(
        "vlm_grpoma.trainer.base.build_engine", lambda *a, **k: pytest.fail("the model loaded")
    )


def _with(shapes_path: Path, out: Path, changes: dict[int, dict]) -> Path:
    """A copy of the shapes records with some records changed (by index)."""
    records = read_records(shapes_path)
    return write_records(out, [dataclasses.replace(r, **changes.get(i, {})) for i, r in enumerate(records)])


def _png_of_zero_size(path: Path) -> Path:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path


def test_a_100k_character_prompt_is_refused_before_the_model_loads(
    shapes_path, make_config, tmp_path, no_model
):
    long = "the red square " * 7000  # 105,000 characters
    data = _with(shapes_path, tmp_path / "data" / "records.jsonl", {2: {"prompt": long}, 5: {"prompt": long}})
    ids = [r.id for r in read_records(data)]
    with pytest.raises(DataError) as caught:
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}"))
    message = str(caught.value)
    assert message.startswith(f"data.train_path: {data} (id {ids[2]}): prompt is ")
    assert (
        "more than data.max_prompt_tokens=4096; fix or drop the record, or set data.skip_bad_records=true"
        in message
    )


def test_skip_bad_records_leaves_out_the_long_prompts(shapes_path, make_config, tmp_path, caplog):
    long = "the red square " * 7000
    data = _with(shapes_path, tmp_path / "data" / "records.jsonl", {2: {"prompt": long}, 5: {"prompt": long}})
    trainer = GRPOMATrainer(
        make_config(tmp_path / "run", f"data.train_path={data}", "data.skip_bad_records=true")
    )
    assert len(trainer.records) == 6 and all(len(r.prompt) < 100 for r in trainer.records)
    assert "skipped 2 of 8 record(s) the model cannot take" in caplog.text


def test_eval_refuses_a_long_prompt_with_one_line_or_leaves_it_out(shapes_path, tiny_path, tmp_path, capsys):
    long = "the red square " * 7000
    data = _with(shapes_path, tmp_path / "data" / "records.jsonl", {3: {"prompt": long}})
    ids = [r.id for r in read_records(data)]
    config = tmp_path / "eval.yaml"
    settings = {"model": {"name_or_path": str(tiny_path)}, "data": {"eval_path": str(data)}}
    config.write_text(json.dumps(settings))
    command = ["eval", "--config", str(config), "--checkpoint", str(tiny_path), "--split", "train"]
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    [line] = error_lines(err)
    assert "Traceback" not in err
    assert line.startswith(f"vlm-grpoma eval: error: data.eval_path {data} (id {ids[3]}): prompt is ")
    settings["data"] |= {"skip_bad_records": True}
    settings["logging"] = {"output_dir": str(tmp_path / "out")}
    config.write_text(json.dumps(settings))
    assert cli.main([*command, "--overlays", "0"]) == 0
    assert "evaluating 7 train records" in capsys.readouterr().out
    predictions = (tmp_path / "out" / "eval-train" / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 7 and ids[3] not in "".join(predictions)


def test_the_prompt_token_count_is_exact(shapes_path, tiny_path):
    from vlm_grpoma.config import ModelConfig

    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_path)))
    record = read_records(shapes_path)[0]
    length = len(adapter.build_inputs([record])[0].input_ids)  # what the model is actually given
    assert prompt_problems([record], adapter, length) == {}
    (problem,) = prompt_problems([record], adapter, length - 1).values()
    assert problem.startswith(f"prompt is {length} tokens (")


def _bad_image_records(shapes_path: Path, folder: Path) -> tuple[Path, list[str]]:
    """Records 1-4 point at: a missing file, a text file, a 0x0 PNG, a 1x50000 image."""
    folder.mkdir(parents=True)
    (folder / "notes.png").write_text("not an image")
    Image.new("RGB", (1, 50000)).save(folder / "sliver.png")
    changes = {
        1: {"image": str(folder / "gone.png")},
        2: {"image": str(folder / "notes.png")},
        3: {"image": str(_png_of_zero_size(folder / "zero.png"))},
        4: {"image": str(folder / "sliver.png"), "width": 1, "height": 50000},
    }
    records = read_records(shapes_path)
    for index in (4,):  # keep the ground-truth box inside the declared image
        box = records[index].ground_truth.boxes[0]
        changes[index]["ground_truth"] = dataclasses.replace(
            records[index].ground_truth, boxes=(dataclasses.replace(box, x1=0, y1=0, x2=1, y2=10),)
        )
    data = write_records(
        folder / "records.jsonl",
        [dataclasses.replace(r, **changes.get(i, {})) for i, r in enumerate(records)],
    )
    return data, [r.id for r in records]


def test_bad_images_are_bad_lines_found_at_load(shapes_path, tmp_path):
    data, ids = _bad_image_records(shapes_path, tmp_path / "data")
    folder = data.parent
    with pytest.raises(RecordError) as caught:
        read_records(data, check_images=True)
    assert str(caught.value) == f"{data}:2 (id {ids[1]}): {folder / 'gone.png'}: image file not found"
    kept = read_records(data, skip_bad=True, check_images=True)
    assert [r.id for r in kept] == [ids[0], *ids[5:]]
    from vlm_grpoma.datasets.jsonl import drop_bad_images, load_records

    errors = [str(e) for e in drop_bad_images(load_records(data)).errors]
    assert (
        errors[1]
        == f"{data}:3 (id {ids[2]}): {folder / 'notes.png'}: image cannot decode: cannot identify image file '{folder / 'notes.png'}'"
    )
    assert errors[2].startswith(f"{data}:4 (id {ids[3]}): {folder / 'zero.png'}: image cannot decode")
    assert errors[3] == (
        f"{data}:5 (id {ids[4]}): {folder / 'sliver.png'}: image is 1x50000: aspect ratio beyond 200:1, which "
        "Qwen-VL refuses"
    )


def test_bad_images_stop_training_eval_sets_and_eval_with_one_line(
    shapes_path, make_config, tiny_path, tmp_path, no_model, capsys
):
    data, ids = _bad_image_records(shapes_path, tmp_path / "data")
    with pytest.raises(
        DataError, match=rf"^data\.train_path: {data}:2 \(id {ids[1]}\): .*gone\.png: image file not found$"
    ):
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}"))
    with pytest.raises(CommandError, match=rf"^data\.eval_sets\.held_out: {data}:2 \(id {ids[1]}\): "):
        GRPOMATrainer(
            make_config(tmp_path / "run2", "train.eval_every=1", f"data.eval_sets={{held_out: {data}}}")
        )
    config = tmp_path / "eval.yaml"
    config.write_text(
        json.dumps({"model": {"name_or_path": str(tiny_path)}, "data": {"eval_path": str(data)}})
    )
    assert (
        cli.main(["eval", "--config", str(config), "--checkpoint", str(tiny_path), "--split", "train"]) == 1
    )
    err = capsys.readouterr().err
    [line] = error_lines(err)  # stderr may also hold library chatter (torch's CUDA-toolkit notice)
    assert "Traceback" not in err and line.startswith(f"vlm-grpoma eval: error: {data}:2 (id {ids[1]}): ")


def test_an_image_whose_resize_leaves_no_pixels_is_refused(shapes_path, make_config, tmp_path, no_model):
    """qwen-vl-utils' smart_resize gives 10x1990 a height of 0 under a small max_pixels (ratio 199 < 200)."""
    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", (1990, 10)).save(folder / "strip.png")
    record = read_records(shapes_path)[0]
    box = dataclasses.replace(record.ground_truth.boxes[0], x1=0, y1=0, x2=5, y2=5)
    strip = dataclasses.replace(
        record,
        image=str(folder / "strip.png"),
        width=1990,
        height=10,
        ground_truth=dataclasses.replace(record.ground_truth, boxes=(box,)),
    )
    data = write_records(folder / "records.jsonl", [strip, *read_records(shapes_path)[1:]])
    with pytest.raises(
        DataError, match=r"image 1990x10 resizes to 1568x0 within model\.min_pixels/model\.max_pixels"
    ):
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}", "model.max_pixels=12544"))


def test_image_checks_are_cached_and_redone_for_a_changed_file(tmp_path, monkeypatch):
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    shapes_path = generate_shapes(
        "detection", 4, tmp_path / "own", seed=1, config=EASY
    )  # this test damages it
    records = read_records(shapes_path)
    assert images.image_problems(records, cache_key=str(shapes_path)) == {}
    real = images._inspect
    monkeypatch.setattr(images, "_inspect", lambda path: pytest.fail(f"{path} was checked again"))
    assert images.image_problems(records, cache_key=str(shapes_path)) == {}
    Path(records[0].image).write_text("damaged")  # a changed file (size and time) is checked again
    seen = []
    monkeypatch.setattr(images, "_inspect", lambda path: seen.append(path) or real(path))
    problems = images.image_problems(records, cache_key=str(shapes_path))
    assert seen == [records[0].image] and list(problems) == [0]


@pytest.mark.parametrize(
    "line,problem",
    [
        ("[" * 100_000 + "]" * 100_000, "refused JSON: nested deeper than 64 levels"),
        (
            '{"id": "x", "meta": {"n": ' + "7" * 5000 + "}}",
            "refused JSON: an integer of 5000 digits (more than 64)",
        ),
        ('{"id": "x", "meta": ' + "[" * 70 + "]" * 70 + "}", "refused JSON: nested deeper than 64 levels"),
    ],
)
def test_deep_json_and_huge_integers_are_bad_lines(shapes_path, tmp_path, line, problem):
    data = tmp_path / "records.jsonl"
    data.write_text(shapes_path.read_text() + line + "\n")
    data_dir = tmp_path
    for image in (shapes_path.parent / "images").iterdir():  # records resolve images next to the file
        (data_dir / "images").mkdir(exist_ok=True)
        (data_dir / "images" / image.name).write_bytes(image.read_bytes())
    with pytest.raises(RecordError, match=rf"^{data}:9: {problem}$".replace("(", r"\(").replace(")", r"\)")):
        read_records(data)
    assert len(read_records(data, skip_bad=True)) == 8


@pytest.mark.parametrize(
    "text,problem",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
        ('{"images": [{"id": ' + "9" * 5000 + "}]}", r"an integer of 5000 digits \(more than 64\)"),
    ],
)
def test_convert_refuses_deep_json_and_huge_integers_with_one_line(tmp_path, capsys, text, problem):
    source = tmp_path / "instances.json"
    source.write_text(text)
    assert cli.main(["convert", "--from", "coco", str(source), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        err.startswith("vlm-grpoma convert: error: ")
        and f"refused JSON: {problem.replace(chr(92), '')}" in err
    )
