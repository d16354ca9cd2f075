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
from vlm_grpoma.errors import DataError
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
    with pytest.raises(DataError, match=rf"^data\.eval_sets\.held_out: {data}:2 \(id {ids[1]}\): "):
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

    # this test damages it
    shapes_path = generate_shapes("detection", 4, tmp_path / "own", seed=1, config=EASY)
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


# ---------------------------------------------------------------------------------------------------------
# Pixels, text and paths that used to pass the checks (issue 36: M4, M5, M7, L8, L9, L10)


def _with_image(shapes_path: Path, folder: Path, image: Path, size: tuple[int, int]) -> tuple[Path, str]:
    """The shapes records with record 1 showing ``image`` (its box moved inside it); the file and that id."""
    records = read_records(shapes_path)
    box = dataclasses.replace(records[1].ground_truth.boxes[0], x1=0, y1=0, x2=4, y2=4)
    records[1] = dataclasses.replace(
        records[1],
        image=str(image),
        width=size[0],
        height=size[1],
        ground_truth=dataclasses.replace(records[1].ground_truth, boxes=(box,)),
    )
    return write_records(folder / "records.jsonl", records), records[1].id


def test_a_16_bit_greyscale_png_keeps_its_levels_in_check_data_and_training(shapes_path, tmp_path):
    import numpy as np

    from vlm_grpoma.datasets.check import check_records

    levels = (np.arange(48 * 64, dtype=np.uint32).reshape(48, 64) * 21).astype(np.uint16)  # 0 .. 64491
    Image.fromarray(levels).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"  # what PIL makes of it (its RGB is all white)
    data, _ = _with_image(shapes_path, tmp_path, tmp_path / "deep.png", (64, 48))
    assert check_records([data]).ok and len(read_records(data, check_images=True)) == 8
    pixels = np.asarray(images.load_image(tmp_path / "deep.png"), dtype=np.int64)
    expected = np.rint(levels / 257.0)  # 65535 -> 255, the 8-bit level of the same brightness
    assert pixels.shape == (48, 64, 3) and np.array_equal(pixels[..., 1], expected)
    assert pixels.min() == 0 and pixels.max() == round(64491 / 257) and pixels.std() > 50


@pytest.mark.parametrize("dtype,kind", [("int32", "integer (mode I)"), ("float32", "float (mode F)")])
def test_32_bit_and_float_pixels_are_refused_alike_by_check_data_and_training(
    shapes_path, tmp_path, dtype, kind
):
    import numpy as np

    from vlm_grpoma.datasets.check import check_records

    Image.fromarray(np.full((48, 64), 70000, dtype=dtype)).save(tmp_path / "wide.tif")
    data, rid = _with_image(shapes_path, tmp_path, tmp_path / "wide.tif", (64, 48))
    problem = f"has 32-bit {kind.replace(' (', ' pixels (')}; save it as 8-bit"
    [checked] = check_records([data]).errors
    assert checked.startswith(f"{data}:2: record {rid}: ") and problem in checked
    with pytest.raises(RecordError) as caught:
        read_records(data, check_images=True)
    assert str(caught.value) == f"{data}:2 (id {rid}): {tmp_path / 'wide.tif'}: image {problem}"


@pytest.mark.timeout(60)  # opening a FIFO would block until this timeout
def test_a_fifo_as_an_image_or_records_file_is_refused_without_opening_it(
    shapes_path, make_config, tmp_path, no_model, capsys
):
    import os

    os.mkfifo(tmp_path / "pipe.png")
    data, rid = _with_image(shapes_path, tmp_path, tmp_path / "pipe.png", (64, 48))
    with pytest.raises(DataError) as caught:
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}"))
    assert str(caught.value).endswith(
        f"{data}:2 (id {rid}): {tmp_path / 'pipe.png'}: image is a FIFO, not a regular file"
    )
    assert cli.main(["check-data", str(data)]) == 1
    assert f"{data}:2: record {rid}: {tmp_path / 'pipe.png'}: image is a FIFO" in capsys.readouterr().out
    os.mkfifo(tmp_path / "records.fifo")
    assert cli.main(["check-data", str(tmp_path / "records.fifo")]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert line.endswith(f"{tmp_path / 'records.fifo'}: records file is not a regular file")


def _raw_lines(shapes_path: Path, out: Path, changes: dict[int, dict]) -> Path:
    """The shapes records as JSON lines with some fields replaced, written as text (``\\ud800`` stays an
    escape: write_records would refuse it); images are resolved to absolute paths."""
    lines = []
    for index, line in enumerate(shapes_path.read_text().splitlines()):
        obj = json.loads(line)
        obj["image"] = str(shapes_path.parent / obj["image"])
        for key, value in changes.get(index, {}).items():
            if key == "label":
                obj["ground_truth"]["boxes"][0]["label"] = value
            else:
                obj[key] = value
        lines.append(json.dumps(obj))  # ensure_ascii: a lone surrogate is written as its escape
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_lone_surrogate_is_a_bad_line_naming_the_record_and_field(
    shapes_path, make_config, tmp_path, no_model, capsys
):
    changes = {1: {"id": "bad-\ud800"}, 3: {"prompt": "box the \udfff square"}, 5: {"label": "red\ud83d"}}
    data = _raw_lines(shapes_path, tmp_path / "records.jsonl", changes)
    assert "\\ud800" in data.read_text()
    problem = "holds a lone surrogate escape (\\ud800-\\udfff alone is not text)"
    from vlm_grpoma.datasets.jsonl import load_records

    errors = [str(e) for e in load_records(data).errors]
    assert errors == [
        f"{data}:2 (id bad-\\ud800): id: {problem}",
        f"{data}:4 (id {json.loads(data.read_text().splitlines()[3])['id']}): prompt: {problem}",
        f"{data}:6 (id {json.loads(data.read_text().splitlines()[5])['id']}): ground_truth.boxes[0].label: {problem}",
    ]
    assert all(e.encode("utf-8") for e in errors)  # printable, unlike the record itself
    with pytest.raises(DataError, match=r"^data\.train_path: .*records\.jsonl:2 \(id bad-\\ud800\): id: "):
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}"))
    assert cli.main(["check-data", str(data)]) == 1
    captured = capsys.readouterr()
    assert "records: 5 valid of 8 read, 3 with errors" in captured.out
    [line] = error_lines(captured.err)
    assert line.endswith(f"3 of 8 record(s) failed the check; first: {errors[0]}")
    from vlm_grpoma.trainer.base import training_records

    left = training_records(
        make_config(tmp_path / "run2", f"data.train_path={data}", "data.skip_bad_records=true")
    )
    kept = [r.id for i, r in enumerate(read_records(shapes_path)) if i not in changes]
    assert [r.id for r in left] == kept


@pytest.mark.parametrize("token", ["<|image_pad|>", "<|video_pad|>", "<|im_end|>", "<|im_start|>"])
def test_special_tokens_in_a_prompt_are_refused_by_train_eval_and_check_data(
    shapes_path, make_config, tiny_path, tmp_path, no_model, capsys, token
):
    data = _with(
        shapes_path, tmp_path / "data" / "records.jsonl", {2: {"prompt": f"Box it.{token} Then stop."}}
    )
    rid = read_records(data)[2].id
    problem = f"prompt holds the model's special token {token} (chat control or vision placeholder)"
    with pytest.raises(DataError) as caught:
        GRPOMATrainer(make_config(tmp_path / "run", f"data.train_path={data}"))
    assert str(caught.value).startswith(f"data.train_path: {data} (id {rid}): {problem}")
    config = tmp_path / "eval.yaml"
    config.write_text(
        json.dumps({"model": {"name_or_path": str(tiny_path)}, "data": {"eval_path": str(data)}})
    )
    assert (
        cli.main(["eval", "--config", str(config), "--checkpoint", str(tiny_path), "--split", "train"]) == 1
    )
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"vlm-grpoma eval: error: data.eval_path {data} (id {rid}): {problem}")
    assert cli.main(["check-data", str(data), "--model", str(tiny_path)]) == 1
    captured = capsys.readouterr()
    assert f"{data}:3 (id {rid}): {problem}" in captured.out and "records: 7 valid of 8 read" in captured.out


def test_a_50_mb_prompt_is_refused_without_tokenising_it(shapes_path, tiny_path, monkeypatch):
    import time

    from vlm_grpoma.config import ModelConfig

    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_path)))
    longest = max(len(token) for token in adapter.tokenizer.get_vocab())
    record = dataclasses.replace(read_records(shapes_path)[0], prompt="the red square " * 3_500_000)
    monkeypatch.setattr(
        adapter.processor, "apply_chat_template", lambda *a, **k: pytest.fail("the prompt was templated")
    )
    start = time.perf_counter()
    (problem,) = prompt_problems([record], adapter, 4096).values()
    assert time.perf_counter() - start < 2.0
    assert problem == (
        f"prompt is 52500000 characters, at least {-(-52_500_000 // longest)} tokens (none is longer than "
        f"{longest} characters), more than data.max_prompt_tokens=4096"
    )


def test_the_character_bound_never_refuses_a_prompt_that_fits(shapes_path, tiny_path):
    """A prompt of the vocabulary's longest token repeated is the most characters per token there is."""
    from vlm_grpoma.config import ModelConfig

    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_path)))
    vocab = adapter.tokenizer.get_vocab()
    special = set(adapter.tokenizer.all_special_tokens)
    longest = max((t for t in vocab if t not in special), key=len)
    text = adapter.tokenizer.convert_tokens_to_string([longest]) * 300
    record = dataclasses.replace(read_records(shapes_path)[0], prompt=text)
    length = len(adapter.build_inputs([record])[0].input_ids)
    assert prompt_problems([record], adapter, length) == {}  # counted exactly, not refused by characters
    assert len(text) > length  # so a bound of one character per token would have refused it


def test_check_data_with_a_model_applies_max_prompt_tokens(shapes_path, tiny_path, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {"name_or_path": str(tiny_path)},
                "data": {"train_path": str(shapes_path), "max_prompt_tokens": 20},
            }
        )
    )
    assert cli.main(["check-data", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    assert "records: 0 valid of 8 read, 8 with errors" in captured.out
    assert "more than data.max_prompt_tokens=20" in captured.out
    [line] = error_lines(captured.err)
    assert line.startswith("vlm-grpoma check-data: error: 8 of 8 record(s) failed the check; first: ")
