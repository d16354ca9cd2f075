"""`vlm-grpoma eval` on records with two images and a video, every family: metrics for every record, overlays on
the target with the other pictures beside it; a record beyond model.max_images is one line naming it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from PIL import Image

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.jsonl import read_records, write_records
from vlm_grpoma.datasets.schema import Video, with_images
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes
from vlm_grpoma.eval.overlays import overlay_size


def _several(tmp_path):
    records = read_records(
        generate_shapes("detection", 3, tmp_path / "shapes", seed=2, config=EASY, split="val")
    )
    Image.new("RGB", (80, 60), (20, 200, 20)).save(tmp_path / "view.png")
    frames = []
    for i in range(3):
        frames.append(str(tmp_path / f"frame{i}.png"))
        Image.new("RGB", (64, 48), (60 * i, 30, 90)).save(frames[-1])
    return [
        replace(with_images(r, (str(tmp_path / "view.png"), r.image), 1), video=Video(tuple(frames), fps=2.0))
        for r in records
    ]


def _config(tmp_path, max_images: int) -> list[str]:
    config = {
        "data": {"eval_path": str(tmp_path / "eval.jsonl")},
        "logging": {"output_dir": str(tmp_path / "run")},
        "rollout": {"max_thought_tokens": 6, "max_answer_tokens": 10},
        "model": {"dtype": "float32", "max_images": max_images, "max_video_frames": 4},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    return ["eval", "--config", str(tmp_path / "c.yaml"), "--split", "val", "--overlays", "2"]


def test_eval_scores_records_with_two_images_and_a_video(arch, tiny_model_dir, tmp_path, capsys):
    records = _several(tmp_path)
    write_records(tmp_path / "eval.jsonl", records)
    args = [*_config(tmp_path, 2), "--checkpoint", str(tiny_model_dir(arch))]
    assert cli_main(args) == 0, capsys.readouterr().err
    out = tmp_path / "run" / "eval-val"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["predictions"] == metrics["records"] == 3
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
    pngs = sorted((out / "overlays").glob("*.png"))
    width, _ = overlay_size(records[0].width, records[0].height)
    assert len(pngs) == 2 and all(Image.open(p).width > width for p in pngs)  # the other pictures beside it


def test_a_record_beyond_model_max_images_is_one_line_naming_it(tiny_model_dir, tmp_path, capsys):
    write_records(tmp_path / "eval.jsonl", _several(tmp_path))
    args = [*_config(tmp_path, 1), "--checkpoint", str(tiny_model_dir("qwen2_vl"))]
    assert cli_main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "Loading weights" not in err  # refused before the model's weights load
    assert len(err.splitlines()) == 1 and err.startswith("vlm-grpoma eval: error: data.eval_path ")
    assert "(id " in err and "2 images, more than model.max_images=1" in err


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
