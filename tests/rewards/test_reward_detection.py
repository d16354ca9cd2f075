"""IoU/GIoU reward and metrics against torchvision and brute-force matching."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou as tv_box_iou
from torchvision.ops import generalized_box_iou as tv_giou

from vlm_grpoma.answers import Box, Boxes, ParseError, Points
from vlm_grpoma.rewards import build_reward
from vlm_grpoma.rewards.detection import (
    IoUReward,
    batch_matched_scores,
    box_iou,
    boxes_array,
    generalized_box_iou,
    matched_score,
    pair_scores,
)


def random_boxes(rng, n, extent=100.0):
    xy = rng.uniform(0, extent, size=(n, 2))
    wh = rng.uniform(0.5, extent / 2, size=(n, 2))
    return np.concatenate([xy, xy + wh], axis=1)


def as_boxes(arr):
    return Boxes(tuple(Box(*map(float, b)) for b in arr))


def brute_force(scores, threshold):
    """Best one-to-one matching by trying every injection of the smaller side into the larger."""
    n, m = scores.shape
    if n == 0 or m == 0:
        return 1.0 if n == m else 0.0
    s = np.where(scores >= threshold, scores, 0.0)
    if n <= m:
        best = max(sum(s[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
    else:
        best = max(sum(s[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m))
    return best / max(n, m)


def test_box_iou_and_giou_match_torchvision():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = random_boxes(rng, rng.integers(1, 8)), random_boxes(rng, rng.integers(1, 8))
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        np.testing.assert_allclose(box_iou(a, b), tv_box_iou(ta, tb).numpy(), atol=1e-12)
        np.testing.assert_allclose(generalized_box_iou(a, b), tv_giou(ta, tb).numpy(), atol=1e-12)


def test_batched_metrics_equal_per_item():
    rng = np.random.default_rng(1)
    a = np.stack([random_boxes(rng, 3) for _ in range(5)])
    b = np.stack([random_boxes(rng, 4) for _ in range(5)])
    batched = generalized_box_iou(a, b)
    assert batched.shape == (5, 3, 4)
    for i in range(5):
        np.testing.assert_allclose(batched[i], generalized_box_iou(a[i], b[i]))


def test_degenerate_ground_truth_scores_zero_not_nan():
    gt = np.array([[5.0, 5.0, 5.0, 9.0]])  # zero width
    assert box_iou(gt, gt)[0, 0] == 0.0
    assert np.isfinite(generalized_box_iou(gt, gt)).all()


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5])
def test_matched_score_equals_brute_force(threshold):
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, m = rng.integers(0, 5), rng.integers(0, 5)
        # clustered boxes so that many pairs overlap and the matching matters
        pred, gt = random_boxes(rng, n, extent=30), random_boxes(rng, m, extent=30)
        scores = box_iou(pred, gt).reshape(n, m)
        assert matched_score(scores, threshold).score == pytest.approx(
            brute_force(scores, threshold), abs=1e-12
        )


def test_matching_is_optimal_not_greedy():
    # greedy (largest first) takes 0.9 then 0.0; optimal takes 0.8 + 0.8
    scores = np.array([[0.9, 0.8], [0.8, 0.0]])
    result = matched_score(scores)
    assert result.score == pytest.approx(0.8) and result.matched_mean == pytest.approx(0.8)


def test_batch_matched_scores_equals_single_calls():
    rng = np.random.default_rng(3)
    preds = [random_boxes(rng, rng.integers(0, 4), 30) for _ in range(300)]
    gts = [random_boxes(rng, rng.integers(0, 4), 30) for _ in range(300)]
    for mode in ("iou", "giou"):
        score, mean = batch_matched_scores(preds, gts, mode, 0.2)
        for i, (p, g) in enumerate(zip(preds, gts)):
            single = matched_score(pair_scores(p, g, mode).reshape(len(p), len(g)), 0.2)
            assert score[i] == pytest.approx(single.score) and mean[i] == pytest.approx(single.matched_mean)


def test_reward_single_box_is_iou(make_record, completions):
    gt = Boxes((Box(0, 0, 10, 10),))
    preds = [Boxes((Box(0, 0, 10, 10),)), Boxes((Box(5, 0, 15, 10),)), Boxes((Box(20, 20, 30, 30),))]
    result = IoUReward().score(completions(preds), [make_record(gt)] * 3)
    assert result.total == pytest.approx([1.0, 50 / 150, 0.0])
    assert result.failures == {}


def test_reward_multi_box_divides_by_larger_count(make_record, completions):
    gt = Boxes((Box(0, 0, 10, 10), Box(20, 20, 30, 30)))
    one = Boxes((Box(20, 20, 30, 30),))
    three = Boxes((Box(0, 0, 10, 10), Box(20, 20, 30, 30), Box(50, 50, 60, 60)))
    swapped = Boxes((Box(20, 20, 30, 30), Box(0, 0, 10, 10)))  # order must not matter
    result = IoUReward().score(completions([one, three, swapped]), [make_record(gt)] * 3)
    assert result.total == pytest.approx([0.5, 2 / 3, 1.0])
    assert result.components["count"] == pytest.approx([0.5, 2 / 3, 1.0])
    assert result.components["matched"] == pytest.approx([1.0, 1.0, 1.0])


def test_reward_negatives(make_record, completions):
    rec = make_record(Boxes(()))
    result = IoUReward().score(completions([Boxes(()), Boxes((Box(0, 0, 1, 1),))]), [rec, rec])
    assert result.total == [1.0, 0.0]
    # and a positive record answered with no boxes scores 0
    pos = make_record(Boxes((Box(0, 0, 1, 1),)))
    assert IoUReward().score(completions([Boxes(())]), [pos]).total == [0.0]


def test_reward_threshold_and_giou(make_record, completions):
    gt = Boxes((Box(0, 0, 10, 10),))
    half = Boxes((Box(5, 0, 15, 10),))  # IoU 1/3
    far = Boxes((Box(30, 0, 40, 10),))  # GIoU = 0 - (40*10 - 200)/400 = -0.5 -> 0.25
    recs = [make_record(gt)] * 2
    assert IoUReward(threshold=0.5).score(completions([half, far]), recs).total == [0.0, 0.0]
    assert IoUReward(threshold=0.3).score(completions([half, far]), recs).total == pytest.approx([1 / 3, 0])
    giou = IoUReward(mode="giou").score(completions([half, far]), recs).total
    assert giou == pytest.approx([(1 / 3 - (150 - 150) / 150 + 1) / 2, 0.25])


def test_threshold_counts_a_score_exactly_at_the_threshold(make_record, completions):
    """ "At or above the threshold counts": IoU exactly 0.5 (a 10x5 box inside a 10x10 one, 50/100) counts at
    threshold 0.5 and not above it, through the 1x1 shortcut and through the matching of 2x2 pairs."""
    gt_one = Boxes((Box(0, 0, 10, 10),))
    pred_one = Boxes((Box(0, 0, 10, 5),))
    gt_two = Boxes((Box(0, 0, 10, 10), Box(50, 50, 60, 60)))
    pred_two = Boxes((Box(50, 55, 60, 60), Box(0, 0, 10, 5)))  # each exactly 0.5 with one ground truth
    assert box_iou(boxes_array(pred_one), boxes_array(gt_one))[0, 0] == 0.5
    recs = [make_record(gt_one), make_record(gt_two)]
    at = IoUReward(threshold=0.5).score(completions([pred_one, pred_two]), recs)
    assert at.total == [0.5, 0.5] and at.components["matched"] == [0.5, 0.5]
    above = IoUReward(threshold=np.nextafter(0.5, 1.0)).score(completions([pred_one, pred_two]), recs)
    assert above.total == [0.0, 0.0]
    scores = np.array([[0.5, 0.0], [0.0, 0.5]])
    assert matched_score(scores, 0.5).score == 0.5 and matched_score(scores, 0.5000001).score == 0.0


def test_reward_zero_for_parse_errors_and_wrong_kind(make_record, completions):
    rec = make_record(Boxes((Box(0, 0, 10, 10),)))
    answers = [
        ParseError("invalid_json"),
        Points(((1, 1),)),
        ParseError("invalid_json"),
        Boxes((Box(0, 0, 10, 10),)),
    ]
    result = build_reward("iou").score(completions(answers), [rec] * 4)
    assert result.total == [0.0, 0.0, 0.0, 1.0]
    assert result.failures == {"invalid_json": 2, "wrong_kind": 1}
    assert all(len(v) == 4 for v in result.components.values())


def test_bad_ground_truth_names_the_record(make_record, completions):
    with pytest.raises(ValueError, match="record bad-7"):
        IoUReward().score(completions([Boxes(())]), [make_record(Points(((1, 1),)), rid="bad-7")])
    with pytest.raises(ValueError, match="mode"):
        IoUReward(mode="dice")
    with pytest.raises(ValueError, match="threshold"):
        IoUReward(threshold=1.5)


def test_fuzz_rewards_finite_and_in_range(make_record, completions):
    rng = np.random.default_rng(4)
    answers, records = [], []
    for i in range(3000):
        n = int(rng.integers(0, 12))
        if i % 10 == 0:
            answers.append(ParseError("invalid_json"))
        else:
            lo = rng.choice([1.0, 1e-6, 1e6]) * rng.uniform(-2, 2, size=(n, 2))
            size = rng.choice([1e-9, 1.0, 1e5]) * rng.uniform(1e-3, 1, size=(n, 2))
            answers.append(as_boxes(np.concatenate([lo, lo + size], axis=1)))
        gt = random_boxes(rng, int(rng.integers(0, 5)))
        gt[: len(gt) // 2, 2] = gt[: len(gt) // 2, 0]  # some degenerate ground-truth boxes too
        records.append(make_record(as_boxes(gt)))
    for reward in (IoUReward(), IoUReward(mode="giou", threshold=0.5)):
        result = reward.score(completions(answers), records)
        for values in [result.total, *result.components.values()]:
            v = np.asarray(values)
            assert v.shape == (3000,) and np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()
