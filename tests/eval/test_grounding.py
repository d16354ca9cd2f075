"""Grounding evaluation: metrics against hand-computed cases and independent references (brute-force matching,
torchvision IoU, hand-derived COCO AP), a perfect model scoring perfectly through the adapters' round trip,
and ``make-data`` -> ``eval`` end to end on a tiny random model."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
import torchvision
import yaml
from PIL import Image
from scipy.ndimage import distance_transform_edt

from vlm_grpoma.answers import Box, Boxes, Points, Trajectory, format_answer, parse_answer
from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.images import load_mask
from vlm_grpoma.datasets.jsonl import read_records, write_records
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, MaskRef, Record
from vlm_grpoma.eval.grounding_metrics import Prediction, coco_ap, max_matches, score_predictions
from vlm_grpoma.eval.overlays import CAPTION_HEIGHT, GT_COLOUR, PRED_COLOUR

THOUGHT = "<think>looking</think>"


def record(gt, task="detection", width=100, height=100, rid=None, image="unused.png") -> Record:
    return Record(
        id=rid or f"r{random.random():.9f}",
        image=image,
        task=task,
        prompt="p",
        width=width,
        height=height,
        ground_truth=gt,
    )


def predict(rec: Record, answer_or_text, sample: int = 0) -> Prediction:
    """A prediction whose answer text is the formatted answer (or the given raw text), parsed back."""
    text = answer_or_text
    if not isinstance(text, str):
        text = f"<answer>{format_answer(text)}</answer>"
    return Prediction(rec, sample, THOUGHT, text, parse_answer(text, ANSWER_KIND_OF_TASK[rec.task]))


def boxes(*coords, label="") -> Boxes:
    return Boxes(tuple(Box(*c, label=label) for c in coords))


# ---------------------------------------------------------------------------------------------- detection


def test_detection_metrics_hand_computed():
    one = boxes((0, 0, 10, 10))
    two = boxes((0, 0, 10, 10), (20, 20, 30, 30))
    preds = [
        predict(record(one), boxes((0, 0, 10, 10))),  # IoU 1
        predict(record(one), boxes((0, 0, 10, 5))),  # IoU 0.5 exactly: matched at 0.5, not at 0.75
        predict(record(two), boxes((20, 20, 30, 30), (0, 0, 10, 8), (50, 50, 60, 60))),  # IoU 1, 0.8, extra
        predict(record(one), "<think>it is at the top left</think>"),  # no answer tag
    ]
    report = score_predictions(preds)
    det = report.tasks["detection"]
    m = det.metrics
    assert m["precision@0.5"] == pytest.approx((1 + 1 + 2 + 0) / 5)
    assert m["precision@0.75"] == pytest.approx((1 + 0 + 2 + 0) / 5)
    assert m["Acc@0.5"] == pytest.approx(2 / 3)  # single-box records: 1, 0.5 -> hit, failure -> miss
    assert m["Acc@0.75"] == pytest.approx(1 / 3)
    assert m["mean_iou"] == pytest.approx((1 + 0.5 + (1 + 0.8) / 3 + 0) / 4)
    assert det.format_rate == det.parse_rate == 0.75
    assert det.failures == {"no_answer_tag": 1}
    failed = report.predictions[3]
    assert failed.failure == "no_answer_tag" and not failed.formatted
    assert failed.scores["iou"] == 0 and failed.scores["matched@0.5"] == 0
    assert failed.summary() == "FAILED: no_answer_tag"
    assert m["ap"] is None and "no label" in det.notes[0]  # unlabelled ground truth: AP skipped, said why
    scalars = report.scalars()
    assert scalars["detection/precision@0.5"] == m["precision@0.5"] and "detection/ap" not in scalars


def _brute_force_matches(iou: np.ndarray, t: float) -> int:
    """Reference: the best one-to-one assignment by trying every injection of the smaller side."""
    n, m = iou.shape
    if n == 0 or m == 0:
        return 0
    if n > m:
        iou, n, m = iou.T, m, n
    perms = itertools.permutations(range(m), n)
    return max(sum(iou[i, j] >= t for i, j in enumerate(perm)) for perm in perms)


def test_detection_precision_matches_independent_reference():
    rng = np.random.default_rng(0)
    preds, n_gt, matched = [], 0, {0.5: 0, 0.75: 0}
    for i in range(60):
        gt_xy = rng.uniform(0, 80, (rng.integers(1, 5), 2))
        gt = np.concatenate([gt_xy, gt_xy + rng.uniform(5, 20, gt_xy.shape)], 1)
        # predictions: jittered copies of some ground-truth boxes plus random ones, so matches are contested
        jitter = gt[rng.permutation(len(gt))[: rng.integers(0, len(gt) + 1)]] + rng.normal(0, 2.5, (1, 4))
        rand_xy = rng.uniform(0, 80, (rng.integers(0, 3), 2))
        pred = np.concatenate([jitter, np.concatenate([rand_xy, rand_xy + 12], 1)])
        pred = pred[(pred[:, 2] > pred[:, 0] + 1) & (pred[:, 3] > pred[:, 1] + 1)]
        rec = record(boxes(*gt.tolist()), rid=f"d{i}")
        preds.append(predict(rec, boxes(*pred.tolist()) if len(pred) else "<answer>[]</answer>"))
        iou = torchvision.ops.box_iou(torch.tensor(pred).reshape(-1, 4), torch.tensor(gt)).numpy()
        n_gt += len(gt)
        for t in matched:
            matched[t] += _brute_force_matches(iou, t)
            assert max_matches(iou, t) == _brute_force_matches(iou, t)
    m = score_predictions(preds).tasks["detection"].metrics
    assert 0 < matched[0.75] < matched[0.5] < n_gt  # the fixture exercises partial matching
    assert m["precision@0.5"] == pytest.approx(matched[0.5] / n_gt)
    assert m["precision@0.75"] == pytest.approx(matched[0.75] / n_gt)


def _ap_pairs(cases):
    return [
        (record(boxes(*gt, label="cat"), rid=f"a{i}"), boxes(*pred, label="cat") if pred else None)
        for i, (gt, pred) in enumerate(cases)
    ]


def test_coco_ap_against_hand_computed_values():
    pytest.importorskip("pycocotools")
    full = (0, 0, 100, 100)
    # all found exactly: AP 1 at every threshold
    ap, _ = coco_ap(_ap_pairs([([full], [full]), ([full], [full])]), [0, 0])
    assert ap == pytest.approx({"ap": 1.0, "ap50": 1.0, "ap75": 1.0})
    # one of two found, no false positive: precision 1 up to recall 0.5 -> 51 of COCO's 101 recall points
    ap, _ = coco_ap(_ap_pairs([([full], [full]), ([full], [])]), [0, 0])
    assert ap == pytest.approx({"ap": 51 / 101, "ap50": 51 / 101, "ap75": 51 / 101})
    # IoU 0.62: a hit at thresholds 0.50, 0.55, 0.60 only -> AP = 3 / 10, AP50 = 1, AP75 = 0
    ap, notes = coco_ap(_ap_pairs([([full], [(0, 0, 100, 62)])]), [0])
    assert ap == pytest.approx({"ap": 0.3, "ap50": 1.0, "ap75": 0.0})
    assert "lower bound" in notes[0]
    # an unlabelled box takes the record's only category; a box naming an unknown category is left out
    gt = record(boxes(full, label="cat"))
    assert coco_ap([(gt, boxes(full))], [0])[0]["ap"] == pytest.approx(1.0)
    assert coco_ap([(gt, boxes(full, label="dog"))], [0])[0]["ap"] == 0.0
    # with two samples the AP is their mean
    ap, _ = coco_ap(_ap_pairs([([full], [full]), ([full], [])]), [0, 1])
    assert ap["ap50"] == pytest.approx((1.0 + 0.0) / 2)


# ---------------------------------------------------------------------------------------------- affordance


def test_affordance_metrics_hand_computed(tmp_path):
    mask = np.zeros((20, 20), dtype=np.uint8)
    mask[5:10, 5:10] = 255
    Image.fromarray(mask, "L").save(tmp_path / "m.png")
    on_mask = record(MaskRef(str(tmp_path / "m.png")), "affordance", 20, 20)
    on_box = record(boxes((10, 10, 20, 20)), "affordance", 40, 30)
    on_point = record(Points(((50.0, 50.0),)), "affordance", 100, 100)  # r_in = 10 * 141.4 / 800 = 1.77 px
    preds = [
        predict(on_mask, Points(((7, 7),))),  # inside: distance 0
        predict(on_mask, Points(((7, 7), (15.5, 7.2)))),  # half inside; pixel (15, 7) is 6 px from column 9
        predict(on_box, Points(((25, 10),))),  # 5 px right of the box
        predict(on_point, Points(((51, 50), (50, 53)))),  # distances 1 (inside r_in) and 3 (outside)
        predict(on_point, '<answer>[{"point_2d": [1]}]</answer>'),  # malformed
    ]
    report = score_predictions(preds)
    aff = report.tasks["affordance"]
    per = [p.scores for p in report.predictions]
    assert [s["accuracy"] for s in per] == [1.0, 0.5, 0.0, 0.5, 0.0]
    diag = math.hypot(100, 100)
    assert [s["distance_px"] for s in per] == pytest.approx([0.0, 3.0, 5.0, 2.0, diag])
    assert aff.metrics["accuracy"] == pytest.approx(2 / 5)
    assert aff.metrics["mean_distance_px"] == pytest.approx((0 + 3 + 5 + 2 + diag) / 5)
    assert aff.metrics["mean_distance_px_valid"] == pytest.approx(10 / 4)
    assert aff.failures == {"bad_shape": 1}


# ---------------------------------------------------------------------------------------------- trajectory


def test_trajectory_metrics_hand_computed():
    rec = record(Trajectory(((0.0, 0.0), (100.0, 0.0))), "trajectory", 100, 200)
    preds = [
        predict(rec, Trajectory(((0, 0), (50, 0), (100, 0)))),  # same path, denser: 0
        predict(rec, Trajectory(((0, 20), (100, 20)))),  # shifted by 20 px of 200 in y: 0.1 everywhere
        predict(rec, "<answer>[[1, 2]]</answer>"),  # one point: too_few_points
    ]
    report = score_predictions(preds)
    per = [p.scores for p in report.predictions]
    for name in ("dfd_resampled", "hausdorff_resampled", "rmse_resampled"):
        assert [s[name] for s in per] == pytest.approx([0.0, 0.1, math.sqrt(2)], abs=1e-12)
        assert report.tasks["trajectory"].metrics[name] == pytest.approx((0.1 + math.sqrt(2)) / 3)
        assert report.tasks["trajectory"].metrics[f"{name}_valid"] == pytest.approx(0.05)
    # on the vertices the denser answer's middle vertex (0.5, 0) is 0.5 from both ground-truth vertices;
    # RMSE interpolates the ground truth to 3 points by index, so (0.5, 0) meets (0.5, 0)
    for name, denser in (("dfd", 0.5), ("hausdorff", 0.5), ("rmse", 0.0)):
        assert [s[name] for s in per] == pytest.approx([denser, 0.1, math.sqrt(2)], abs=1e-12)
        assert report.tasks["trajectory"].metrics[f"{name}_valid"] == pytest.approx((denser + 0.1) / 2)
    assert report.tasks["trajectory"].failures == {"too_few_points": 1}


def test_malformed_answers_score_as_failures_never_raise():
    rng = random.Random(0)
    pieces = [
        "<answer>",
        "</answer>",
        "<think>",
        "[",
        "]",
        "{",
        "}",
        '"bbox_2d"',
        '"point_2d"',
        ":",
        ",",
        "1e999",
        "-5",
        "3",
        "NaN",
        "null",
        "[[1,2],[3,4]]",
        "[0,0,10,10]",
        "```json",
        "\n",
        "ü",
    ]
    gts = {
        "detection": boxes((0, 0, 10, 10)),
        "affordance": boxes((0, 0, 10, 10)),
        "trajectory": Trajectory(((0.0, 0.0), (9.0, 9.0))),
    }
    preds = [
        predict(record(gts[task], task, 20, 20), "".join(rng.choices(pieces, k=rng.randint(0, 12))))
        for task in gts
        for _ in range(300)
    ]
    payload = score_predictions(preds).to_json()
    text = json.dumps(payload, allow_nan=False)  # every number finite
    assert payload["predictions"] == 900 and "NaN" not in text
    for task in payload["tasks"].values():
        assert sum(task["failures"].values()) == round(task["predictions"] * (1 - task["parse_rate"]))


# ---------------------------------------------------------------------------------------------- perfect model


def _deepest_mask_point(rec: Record) -> tuple[float, float]:
    """Centre of the mask pixel farthest from the mask's border (survives rounding by a pixel)."""
    depth = distance_transform_edt(load_mask(rec))
    row, col = np.unravel_index(np.argmax(depth), depth.shape)
    return float(col) + 0.5, float(row) + 0.5


def _perfect_answer(rec: Record):
    return Points((_deepest_mask_point(rec),)) if isinstance(rec.ground_truth, MaskRef) else rec.ground_truth


@pytest.fixture(scope="module")
def shapes_records(tmp_path_factory):
    from vlm_grpoma.datasets.synthetic.shapes import generate_shapes

    out = tmp_path_factory.mktemp("shapes")
    return [
        r
        for task in ("detection", "affordance", "trajectory")
        for r in read_records(generate_shapes(task, 4, out / task, seed=3, split="val"))
    ]


def _assert_perfect(report, exact: bool):
    det, aff, traj = (report.tasks[t].metrics for t in ("detection", "affordance", "trajectory"))
    assert det["precision@0.5"] == det["precision@0.75"] == det["Acc@0.5"] == 1.0
    assert det["ap"] == pytest.approx(1.0) and det["ap50"] == pytest.approx(1.0)  # shapes boxes carry labels
    assert aff["accuracy"] == 1.0
    assert all(t.format_rate == t.parse_rate == 1.0 and not t.failures for t in report.tasks.values())
    if exact:
        assert det["mean_iou"] == 1.0 and aff["mean_distance_px"] == 0.0
        assert traj["dfd"] == traj["hausdorff"] == traj["rmse"] == pytest.approx(0.0, abs=1e-12)
    else:  # integer model-frame coordinates: at most a pixel or so off
        assert det["mean_iou"] > 0.95 and aff["mean_distance_px"] == 0.0
        assert max(traj["dfd"], traj["hausdorff"], traj["rmse"]) < 0.01


def test_perfect_answers_score_perfectly(shapes_records):
    answers = [_perfect_answer(r) for r in shapes_records]
    preds = [
        Prediction(r, 0, THOUGHT, f"<answer>{format_answer(a)}</answer>", a)
        for r, a in zip(shapes_records, answers)
    ]
    _assert_perfect(score_predictions(preds), exact=True)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_perfect_model_through_adapter_round_trip(arch, shapes_records, tiny_model_dir):
    """Ground truth written in the model's frame by the adapter, parsed back to pixels, scores perfectly."""
    from vlm_grpoma.models.registry import load_adapter

    adapter = load_adapter(ModelConfig(name_or_path=str(tiny_model_dir(arch))))
    preds = []
    for r in shapes_records:
        text = f"<answer>{adapter.format_answer(_perfect_answer(r), r)}</answer>"
        preds.append(Prediction(r, 0, THOUGHT, text, adapter.parse_answer(text, r)))
    _assert_perfect(score_predictions(preds), exact=False)


# ---------------------------------------------------------------------------------------------- end to end


def test_make_data_then_eval_on_tiny_model(tmp_path, tiny_model_dir, capsys):
    torch.set_num_threads(1)
    for task in ("detection", "affordance", "trajectory"):
        assert (
            cli_main(
                [
                    "make-data",
                    "--task",
                    task,
                    "--source",
                    "shapes",
                    "--n",
                    "2",
                    "--out",
                    str(tmp_path / task),
                    "--split",
                    "val",
                    "--difficulty",
                    "easy",
                    "--seed",
                    "1",
                ]
            )
            == 0
        )
    records = [
        r
        for t in ("detection", "affordance", "trajectory")
        for r in read_records(tmp_path / t / "records.jsonl")
    ]
    write_records(tmp_path / "eval.jsonl", records)
    config = {
        "data": {"eval_path": str(tmp_path / "eval.jsonl")},
        "logging": {"output_dir": str(tmp_path / "run")},
        "rollout": {"max_thought_tokens": 6, "max_answer_tokens": 10},
        "model": {"dtype": "float32"},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    checkpoint = str(tiny_model_dir("qwen2_5_vl"))
    eval_args = ["eval", "--config", str(tmp_path / "c.yaml"), "--checkpoint", checkpoint]
    capsys.readouterr()
    assert cli_main([*eval_args, "--split", "val"]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "run" / "eval-val"
    assert str(out / "metrics.json") in printed and "| format rate |" in printed

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["split"] == "val" and metrics["greedy"]
    assert metrics["predictions"] == metrics["records"] == 6
    assert set(metrics["tasks"]) == {"detection", "affordance", "trajectory"}
    expected = {
        "detection": {"precision@0.5", "precision@0.75", "Acc@0.5", "mean_iou", "ap", "ap50"},
        "affordance": {"accuracy", "mean_distance_px"},
        "trajectory": {"dfd", "hausdorff", "rmse"},
    }
    for name, task in metrics["tasks"].items():
        assert expected[name] <= set(task["metrics"])
        assert 0 <= task["format_rate"] <= task["parse_rate"] <= 1
        for value in task["metrics"].values():
            assert value is None or math.isfinite(value)
        assert sum(task["failures"].values()) == round(task["predictions"] * (1 - task["parse_rate"]))

    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["id"] for p in lines) == sorted(r.id for r in records)
    failed = [p for p in lines if p["failure"]]
    assert failed, "a random model should fail to answer at least once"
    for p in lines:
        assert (p["parsed"] is None) == bool(p["failure"])
        assert isinstance(p["answer_text"], str) and isinstance(p["thought"], str)
    for p in failed:  # a failure scores like the worst answer
        worst = {
            "detection": ("iou", 0.0),
            "affordance": ("accuracy", 0.0),
            "trajectory": ("dfd", math.sqrt(2)),
        }
        key, value = worst[p["task"]]
        assert p["scores"][key] == pytest.approx(value)
    report_md = (out / "report.md").read_text()
    assert "## detection (2 records)" in report_md and "| precision@0.5 |" in report_md

    pngs = sorted((out / "overlays").glob("*.png"))
    assert len(pngs) == 6  # fewer records than the default 16 overlays: one each
    side = 112 * math.ceil(384 / 112)  # easy shapes are 112 px, scaled by an integer factor to >= 384
    for png in pngs:
        with Image.open(png) as img:
            assert img.format == "PNG" and img.size == (side, side + CAPTION_HEIGHT)
            pixels = np.asarray(img.convert("RGB"))
        assert (pixels[:side] == GT_COLOUR).all(-1).any()  # ground truth drawn
    failed_ids = {p["id"] for p in failed}
    failed_png = next(p for p in pngs if any(i in p.name for i in failed_ids))
    caption = np.asarray(Image.open(failed_png).convert("RGB"))[side:]
    assert (caption == PRED_COLOUR).all(-1).any()  # the failure caption is drawn in red

    # a split with no records, or a missing checkpoint, is one clear error
    assert cli_main([*eval_args, "--split", "test"]) == 1
    assert "--split test: no records" in capsys.readouterr().err
    assert cli_main([*eval_args[:-1], str(tmp_path / "nope"), "--split", "val"]) == 1
    assert "nope: not a folder" in capsys.readouterr().err


def test_bad_ground_truth_is_an_error_naming_the_record():
    wrong = record(Points(((1.0, 1.0),)), "detection", rid="det-7")
    with pytest.raises(ValueError, match="det-7.*box ground truth"):
        score_predictions([predict(wrong, "<answer>[]</answer>")])
    with pytest.raises(ValueError, match="traj-3"):
        score_predictions([predict(record(boxes((0, 0, 1, 1)), "trajectory", rid="traj-3"), "x")])


def test_evaluate_library_call_sampled(shapes_records, tiny_model_dir, tmp_path):
    """The in-process entry point (the trainer's periodic eval): K samples per record, record order kept."""
    from vlm_grpoma.config import RolloutConfig
    from vlm_grpoma.eval.grounding import evaluate
    from vlm_grpoma.models.loading import load_model

    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_5_vl")), dtype="float32"))
    records = shapes_records[::2]
    rollout = RolloutConfig(max_thought_tokens=4, max_answer_tokens=6, temperature=1.0)
    report = evaluate(
        loaded.model,
        loaded.adapter,
        records,
        greedy=False,
        samples=2,
        batch_size=4,
        seed=1,
        out_dir=tmp_path / "ev",
        overlays=2,
        rollout=rollout,
    )
    assert [(p.prediction.record.id, p.prediction.sample) for p in report.predictions] == [
        (r.id, k) for r in records for k in range(2)
    ]
    payload = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert payload["samples"] == 2 and not payload["greedy"] and payload["predictions"] == 2 * len(records)
    assert len(report.files["overlays"]) == 2 and all(p.is_file() for p in report.files["overlays"])
    again = evaluate(
        loaded.model, loaded.adapter, records, greedy=False, samples=2, batch_size=4, seed=1, rollout=rollout
    )
    # seeded
    assert [p.prediction.answer_text for p in again.predictions] == [
        p.prediction.answer_text for p in report.predictions
    ]
    with pytest.raises(ValueError, match="greedy"):
        evaluate(loaded.model, loaded.adapter, records, greedy=True, samples=2)
    manip = Record(
        id="m0",
        image="x.png",
        task="manipulation",
        prompt="p",
        width=10,
        height=10,
        ground_truth=Points(((1.0, 1.0),)),
    )
    with pytest.raises(ValueError, match="m0.*manip-eval"):
        evaluate(loaded.model, loaded.adapter, [manip])
