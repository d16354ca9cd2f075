"""What ``eval`` reports and where: pass@k against the direct binomial formula, best-of-k, a folder per
checkpoint step, the summary across splits, bad ``--samples`` / ``--out`` as one line before the model loads,
and a model answer holding a lone surrogate written without a crash."""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import yaml

from vlm_grpoma.answers import Box, Boxes, Points, Trajectory, format_answer, parse_answer
from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.jsonl import write_records
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record
from vlm_grpoma.eval.grounding import checkpoint_step, eval_layout
from vlm_grpoma.eval.grounding_metrics import Prediction, score_predictions
from vlm_grpoma.eval.grounding_report import write_report
from vlm_grpoma.eval.sampled_metrics import add_sampled_metrics, pass_at_k, report_ks


def _record(gt, task="detection", rid="r0", split="val") -> Record:
    return Record(
        id=rid, image="unused.png", task=task, prompt="p", width=100, height=100, ground_truth=gt, split=split
    )


def _predict(rec: Record, answer, sample: int) -> Prediction:
    text = f"<think>t</think><answer>{format_answer(answer)}</answer>"
    return Prediction(
        rec, sample, "<think>t</think>", text, parse_answer(text, ANSWER_KIND_OF_TASK[rec.task])
    )


# ---------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_equals_the_binomial_formula():
    """Chen et al. 2021 eq. 1: 1 - C(n-c, k) / C(n, k), written with math.comb, for every n <= 12."""
    for n in range(1, 13):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            expected = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_is_the_chance_that_some_drawn_subset_holds_a_correct_sample():
    """Independently: enumerate every k-subset of the n samples and count those with a correct one."""
    outcomes = [True, False, False, True, False]
    for k in range(1, 6):
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(5, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    assert report_ks(1) == [1] and report_ks(4) == [1, 2, 4] and report_ks(6) == [1, 2, 4, 6]


def test_sampled_report_has_pass_at_k_and_best_of_k_beside_the_mean():
    one = Boxes((Box(0, 0, 10, 10),))
    hit, near, miss = Boxes((Box(0, 0, 10, 10),)), Boxes((Box(0, 0, 10, 6),)), Boxes((Box(50, 50, 60, 60),))
    a, b = _record(one, rid="a"), _record(one, rid="b")
    traj = _record(Trajectory(((0.0, 0.0), (50.0, 50.0))), task="trajectory", rid="t")
    preds = [
        _predict(a, hit, 0),
        _predict(a, miss, 1),
        _predict(a, miss, 2),
        _predict(a, near, 3),
        _predict(b, miss, 0),
        _predict(b, miss, 1),
        _predict(b, miss, 2),
        _predict(b, miss, 3),
        _predict(traj, Trajectory(((0.0, 0.0), (50.0, 50.0))), 0),
        _predict(traj, Trajectory(((0.0, 0.0), (90.0, 10.0))), 1),
        _predict(traj, Trajectory(((100.0, 100.0), (0.0, 0.0))), 2),
        _predict(traj, Trajectory(((0.0, 0.0), (50.0, 60.0))), 3),
    ]
    report = score_predictions(preds, samples=4, greedy=False)
    add_sampled_metrics(report)
    det = report.tasks["detection"].metrics
    # a: 2 of 4 samples at IoU >= 0.5 (1.0 and 0.6), b: none
    assert det["Acc@0.5"] == pytest.approx(2 / 8)  # the mean over samples, unchanged
    assert det["pass@1"] == pytest.approx((0.5 + 0) / 2)
    assert det["pass@2"] == pytest.approx((1 - math.comb(2, 2) / math.comb(4, 2)) / 2)
    assert det["pass@4"] == pytest.approx(0.5)
    assert det["best_of_4/iou"] == pytest.approx((1.0 + 0.0) / 2)
    trajectory = report.tasks["trajectory"].metrics
    assert not any(k.startswith("pass@") for k in trajectory)  # no success rule for trajectories
    assert trajectory["best_of_4/dfd"] == pytest.approx(0.0, abs=1e-12)  # the exact sample wins


def test_greedy_report_has_no_sampled_metrics():
    rec = _record(Points(((5.0, 5.0),)), task="affordance")
    report = score_predictions([_predict(rec, Points(((5.0, 5.0),)), 0)])
    add_sampled_metrics(report)
    assert not any(k.startswith(("pass@", "best_of")) for k in report.tasks["affordance"].metrics)


# ---------------------------------------------------------------------------------------------- layout


def test_each_checkpoint_step_gets_its_own_folders(tmp_path):
    assert checkpoint_step(tmp_path / "run" / "checkpoints" / "step-00000060" / "model") == 60
    assert checkpoint_step(tmp_path / "run" / "checkpoints" / "step-00000060") == 60
    assert checkpoint_step(tmp_path / "models" / "step-3" / "model") is None  # not a run's checkpoint
    a = eval_layout(None, "runs/x", 10, ["val", "testA"])
    b = eval_layout(None, "runs/x", 20, ["val", "testA"])
    assert a.split_dirs["val"].name == "eval-val-step-10" and a.summary.name == "eval-summary-step-10.json"
    assert set(a.split_dirs.values()).isdisjoint(b.split_dirs.values()) and a.summary != b.summary
    out = eval_layout("results/r1", "runs/x", 10, ["val"])
    assert out.split_dirs["val"] == out.root / "val" and out.summary == out.root / "summary.json"


def test_a_lone_surrogate_in_a_model_answer_is_written_and_read_back(tmp_path):
    """M6: the label ``"\\ud800"`` parses to a lone surrogate; predictions.jsonl must still be written."""
    rec = _record(Boxes((Box(0, 0, 10, 10),)))
    text = '<think>t</think><answer>[{"bbox_2d": [0, 0, 10, 10], "label": "\\ud800 cat"}]</answer>'
    pred = Prediction(rec, 0, "<think>t</think>", text, parse_answer(text, "boxes"))
    assert pred.answer.boxes[0].label == "\ud800 cat"
    files = write_report(score_predictions([pred]), tmp_path / "ev", overlays=0)
    [line] = [json.loads(x) for x in files["predictions"].read_text(encoding="utf-8").splitlines()]
    assert line["parsed"][0]["label"] == "\ud800 cat" and line["answer_text"] == text
    assert json.loads(files["metrics"].read_text())["tasks"]["detection"]["metrics"]["Acc@0.5"] == 1.0


def test_an_overlay_that_cannot_be_drawn_loses_no_metrics(tmp_path, caplog):
    rec = _record(Boxes((Box(0, 0, 10, 10),)))  # its image file does not exist
    files = write_report(score_predictions([_predict(rec, rec.ground_truth, 0)]), tmp_path / "ev", overlays=1)
    assert files["overlays"] == [] and "overlay of record r0 not drawn" in caplog.text
    assert files["predictions"].is_file() and json.loads(files["metrics"].read_text())["records"] == 1


def test_a_several_image_overlay_draws_on_the_target_and_shows_the_others_as_thumbnails(tmp_path):
    from PIL import Image

    from vlm_grpoma.datasets.schema import Video, with_images
    from vlm_grpoma.eval.overlays import THUMB_GAP, THUMB_SIDE, overlay_size

    Image.new("RGB", (100, 100), (250, 250, 250)).save(tmp_path / "front.png")
    Image.new("RGB", (60, 200), (0, 0, 255)).save(tmp_path / "wrist.png")
    for i in range(2):
        Image.new("RGB", (40, 30), (255, 0, 255)).save(tmp_path / f"frame{i}.png")
    rec = with_images(
        _record(Boxes((Box(10, 10, 50, 50),))), (str(tmp_path / "wrist.png"), str(tmp_path / "front.png")), 1
    )
    rec = replace(rec, video=Video((str(tmp_path / "frame0.png"), str(tmp_path / "frame1.png"))))
    answer = Boxes((Box(60, 60, 90, 90),))
    files = write_report(score_predictions([_predict(rec, answer, 0)]), tmp_path / "ev", overlays=1)
    (png,) = files["overlays"]
    pixels = np.asarray(Image.open(png).convert("RGB"))
    width, height = overlay_size(100, 100)
    assert (
        pixels.shape[1] == width + THUMB_SIDE + 2 * THUMB_GAP
    )  # the target at its usual size, then a column
    assert (pixels[:height, :width] == (0, 190, 0)).all(-1).any()  # the ground truth is drawn on the target
    column = pixels[:, width:]
    assert (column == (0, 0, 255)).all(-1).sum() == (THUMB_SIDE * 60 // 200) * THUMB_SIDE  # wrist, scaled in
    video = (column == (255, 0, 255)).all(-1).sum()
    assert video == 2 * 40 * 30  # the video's first and last frames too (small ones are not enlarged)


# ---------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("samples", ["0", "-3"])
def test_bad_samples_is_one_line_before_anything_loads(tmp_path, capsys, samples):
    """L22: checked before the checkpoint is even looked at (its path does not exist here)."""
    assert cli_main(["eval", "--checkpoint", str(tmp_path / "nope"), "--samples", samples]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"vlm-grpoma eval: error: --samples {samples}: must be >= 1 (1 = greedy, K > 1 = K sampled answers)"
    )


@pytest.fixture
def eval_run(tmp_path, tiny_model_dir):
    """A run folder with two checkpoints (the tiny model) and records of two held-out splits."""
    from vlm_grpoma.datasets.jsonl import read_records
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    records = []
    for split in ("val", "testA"):
        path = generate_shapes("detection", 2, tmp_path / split, seed=5, split=split, config=EASY)
        records += read_records(path)
    write_records(tmp_path / "eval.jsonl", records)
    run = tmp_path / "run"
    for step in (1, 2):
        folder = run / "checkpoints" / f"step-{step:08d}"
        folder.mkdir(parents=True)
        os.symlink(tiny_model_dir("qwen2_5_vl"), folder / "model")
    config = {
        "data": {"eval_path": str(tmp_path / "eval.jsonl")},
        "logging": {"output_dir": str(run)},
        "rollout": {"max_thought_tokens": 4, "max_answer_tokens": 8},
        "model": {"dtype": "float32"},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    return run, ["eval", "--config", str(tmp_path / "c.yaml"), "--overlays", "0"]


def test_two_checkpoints_two_folders_and_a_summary_across_splits(eval_run, capsys):
    torch.set_num_threads(1)
    run, command = eval_run
    for step in (1, 2):
        model = run / "checkpoints" / f"step-{step:08d}" / "model"
        assert cli_main([*command, "--checkpoint", str(model)]) == 0
    printed = capsys.readouterr().out
    for step in (1, 2):
        summary = json.loads((run / f"eval-summary-step-{step}.json").read_text())
        assert summary["step"] == step and list(summary["splits"]) == ["val", "testA"]
        for split in ("val", "testA"):
            metrics = json.loads((run / f"eval-{split}-step-{step}" / "metrics.json").read_text())
            assert metrics["step"] == step and metrics["split"] == split and metrics["records"] == 2
            detection = metrics["tasks"]["detection"]["metrics"]
            assert summary["splits"][split]["detection"]["Acc@0.5"] == detection["Acc@0.5"]
    assert "# Summary over val, testA" in printed and "| split | records | format_rate | Acc@0.5 |" in printed
    assert (run / "eval-summary-step-2.md").read_text().count("| testA |") == 1


def test_sampled_eval_into_out_reports_pass_at_k(eval_run, tmp_path, capsys):
    torch.set_num_threads(1)
    run, command = eval_run
    model = run / "checkpoints" / "step-00000002" / "model"
    out = tmp_path / "results"
    args = [*command, "--checkpoint", str(model), "--split", "val", "--samples", "2", "--out", str(out)]
    assert cli_main(args) == 0
    metrics = json.loads((out / "val" / "metrics.json").read_text())
    detection = metrics["tasks"]["detection"]["metrics"]
    assert metrics["samples"] == 2 and {"pass@1", "pass@2", "best_of_2/iou"} <= set(detection)
    lines = [json.loads(x) for x in (out / "val" / "predictions.jsonl").read_text().splitlines()]
    correct: dict[str, list[bool]] = {}
    for p in lines:  # the success rule by hand: Acc@0.5 for one box, else every box matched at 0.5
        s = p["scores"]
        correct.setdefault(p["id"], []).append(
            s["Acc@0.5"] == 1 if "Acc@0.5" in s else s["matched@0.5"] == s["gt_boxes"]
        )
    assert detection["pass@1"] == pytest.approx(sum(sum(c) / 2 for c in correct.values()) / len(correct))
    assert detection["pass@2"] == pytest.approx(sum(any(c) for c in correct.values()) / len(correct))
    best = {i: max(p["scores"]["iou"] for p in lines if p["id"] == i) for i in correct}
    assert detection["best_of_2/iou"] == pytest.approx(sum(best.values()) / len(best))
    assert "pass@2" in (out / "summary.md").read_text() and not list(run.glob("eval-*"))


def test_an_unwritable_out_is_one_line_before_the_model_loads(eval_run, tmp_path, capsys):
    """L20: the output folder is checked first (here a file stands where the folder should be)."""
    run, command = eval_run
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    model = run / "checkpoints" / "step-00000001" / "model"
    assert cli_main([*command, "--checkpoint", str(model), "--out", str(blocker / "sub")]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"vlm-grpoma eval: error: --out {blocker / 'sub'}: cannot write there: ")
    assert len(captured.err.strip().splitlines()) == 1 and "model:" not in captured.out
