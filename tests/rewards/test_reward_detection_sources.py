"""The ``visual_rft`` and ``vlm_r1`` matchings of the IoU reward against references re-written, loop for loop,
from each source's published reward code; and the sizes of the differences the default (``hungarian``) keeps."""

from __future__ import annotations

import numpy as np
import pytest

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.rewards import build_rewards
from vlm_grpoma.rewards.detection import IoUReward

# -- references ---------------------------------------------------------------------------------------------


def visual_rft_reference(pred: list[list[float]], gt: list[list[float]], iou_threshold: float = 0.5) -> float:
    """Liuziyu77/Visual-RFT ``src/virft/src/open_r1/grpo.py`` (``accuracy_reward_iou`` after parsing):
    ``calculate_iou``, ``remove_duplicates``, ``sort_and_calculate_iou`` (equal confidences: Python's stable
    sort keeps answer order), ``compute_reward_iou_v2``, capped at 1; an empty answer list fails on
    ``student_answer_bbox[0]`` inside the ``try`` and scores 0."""

    def calculate_iou(b1, b2):
        x1, y1, x2, y2 = b1
        x1_2, y1_2, x2_2, y2_2 = b2
        xi1, yi1, xi2, yi2 = max(x1, x1_2), max(y1, y1_2), min(x2, x2_2), min(y2, y2_2)
        if xi2 <= xi1 or yi2 <= yi1:
            return 0.0
        inter = (xi2 - xi1) * (yi2 - yi1)
        return inter / ((x2 - x1) * (y2 - y1) + (x2_2 - x1_2) * (y2_2 - y1_2) - inter)

    if not pred:
        return 0.0
    seen, unique = set(), []
    for b in pred:
        if tuple(b) not in seen:
            seen.add(tuple(b))
            unique.append(b)
    results, matched = [], set()
    for b2 in unique:
        best, match = 0, -1
        for i, b1 in enumerate(gt):
            if i not in matched:
                iou = calculate_iou(b1, b2)
                if iou > best:
                    best, match = iou, i
        if best > iou_threshold:
            results.append(best)
            matched.add(match)
        else:
            results.append(0)
    total = sum(results)
    reward = total / len(gt) if len(gt) >= len(results) else total / len(results)
    return min(reward, 1.0)


def vlm_r1_reference(pred: list[dict], gt: list[dict], iou_threshold=0.5, alpha=0.7, beta=0.0, gamma=0.3):
    """om-ai-lab/VLM-R1 ``src/open-r1-multimodal/src/open_r1/grpo_jsonl.py``: ``iou`` and ``detection_score``
    (accuracy method ``weighted_sum``) on ``{"bbox_2d": [...], "label": ...}`` items."""

    def iou(box1, box2):
        ix1, iy1 = max(box1[0], box2[0]), max(box1[1], box2[1])
        ix2, iy2 = min(box1[2] - 1, box2[2] - 1), min(box1[3] - 1, box2[3] - 1)
        inter = (ix2 - ix1 + 1) * (iy2 - iy1 + 1) if ix1 < ix2 and iy1 < iy2 else 0
        union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
        return float(inter) / union

    if len(gt) == 0:
        return 1.0 if not pred else 0.0
    if len(pred) == 0:
        return 0.0
    matches, free_pred, free_gt = [], list(range(len(pred))), list(range(len(gt)))
    table = [[iou(p["bbox_2d"], g["bbox_2d"]) for g in gt] for p in pred]
    while free_pred and free_gt:
        best, bi, bj = -1, -1, -1
        for i in free_pred:
            for j in free_gt:
                if table[i][j] > best:
                    best, bi, bj = table[i][j], i, j
        if best < iou_threshold:
            break
        right = pred[bi]["label"].lower() == gt[bj]["label"].lower()
        matches.append((best if right else 0, right))
        free_pred.remove(bi)
        free_gt.remove(bj)
    position = sum(m[0] for m in matches) / len(gt) if matches else 0.0
    label = sum(1.0 for m in matches if m[1]) / len(gt) if matches else 0.0
    completeness = 1.0 - (len(free_gt) / len(gt) + len(free_pred) / len(pred)) / 2.0
    return (alpha * position + beta * label + gamma * completeness) / (alpha + beta + gamma)


# -- cases --------------------------------------------------------------------------------------------------


def boxes(rows, labels=None):
    labels = labels or [""] * len(rows)
    return Boxes(tuple(Box(*map(float, r), label=lab) for r, lab in zip(rows, labels)))


def random_case(rng):
    """Clustered integer boxes (pixel answers), with planted exact duplicates and some half-boxes (IoU 0.5)."""
    n, m = int(rng.integers(0, 5)), int(rng.integers(0, 4))
    gt = []
    for _ in range(m):
        x, y = rng.integers(0, 30, size=2)
        w, h = rng.integers(2, 16, size=2)
        gt.append([int(x), int(y), int(x + w), int(y + h)])
    pred = []
    for _ in range(n):
        kind = rng.random()
        if gt and kind < 0.2:  # the top half of a ground-truth box: IoU exactly 0.5 when its height is even
            x1, y1, x2, y2 = gt[int(rng.integers(len(gt)))]
            pred.append([x1, y1, x2, y1 + (y2 - y1) // 2])
        elif pred and kind < 0.35:
            pred.append(list(pred[int(rng.integers(len(pred)))]))  # exact duplicate
        else:
            x, y = rng.integers(0, 30, size=2)
            w, h = rng.integers(2, 16, size=2)
            pred.append([int(x), int(y), int(x + w), int(y + h)])
    return pred, gt


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(34)
    return [random_case(rng) for _ in range(3000)]


def test_visual_rft_matching_equals_its_published_reward(make_record, completions, cases):
    reward = IoUReward(matching="visual_rft")
    answers = [boxes(p) for p, _ in cases]
    records = [make_record(boxes(g)) for _, g in cases]
    got = reward.score(completions(answers), records).total
    expected = [visual_rft_reference(p, g) for p, g in cases]
    assert got == pytest.approx(expected, abs=1e-12)
    assert sum(len(set(map(tuple, p))) < len(p) for p, _ in cases) > 300  # duplicates were exercised


def test_vlm_r1_matching_equals_its_published_detection_score(make_record, completions, cases):
    rng = np.random.default_rng(35)
    names = ["cup", "Cup", "bowl"]
    labelled = [([rng.choice(names) for _ in p], [rng.choice(names) for _ in g], p, g) for p, g in cases]
    answers = [boxes(p, list(lp)) for lp, _, p, _ in labelled]
    records = [make_record(boxes(g, list(lg))) for _, lg, _, g in labelled]
    got = IoUReward(matching="vlm_r1").score(completions(answers), records).total
    expected = [
        vlm_r1_reference(
            [{"bbox_2d": b, "label": lab} for b, lab in zip(p, lp)],
            [{"bbox_2d": b, "label": lab} for b, lab in zip(g, lg)],
        )
        for lp, lg, p, g in labelled
    ]
    assert got == pytest.approx(expected, abs=1e-12)


def test_hand_built_duplicates_and_exact_thresholds(make_record, completions):
    """Exact duplicates: hungarian matches one copy (0.5), Visual-RFT drops the copy (1.0). An IoU of exactly
    0.5: hungarian counts it (at or above 0 / 0.5), Visual-RFT does not (it must exceed 0.5), VLM-R1 does."""
    gt = boxes([[0, 0, 10, 10]])
    dup = boxes([[0, 0, 10, 10], [0, 0, 10, 10]])
    half = boxes([[0, 0, 10, 5]])
    rec = [make_record(gt)] * 2
    score = {
        m: IoUReward(matching=m).score(completions([dup, half]), rec).total
        for m in ("hungarian", "visual_rft")
    }
    assert score["hungarian"] == [0.5, 0.5] and score["visual_rft"] == [1.0, 0.0]
    # VLM-R1: the duplicate is a false alarm (0.7·1 + 0.3·(1 − (0 + 1/2)/2)); the half box is matched at 0.5
    vlm = IoUReward(matching="vlm_r1").score(completions([dup, half]), rec).total
    assert vlm == pytest.approx([0.7 + 0.3 * 0.75, 0.7 * 0.5 + 0.3])
    reference = vlm_r1_reference(
        [{"bbox_2d": [0, 0, 10, 5], "label": ""}], [{"bbox_2d": [0, 0, 10, 10], "label": ""}]
    )
    assert vlm[1] == reference  # bit for bit: the same operations in the same order


def test_empty_answers_and_negatives_follow_each_source(make_record, completions):
    negative, positive = make_record(boxes([])), make_record(boxes([[0, 0, 4, 4]]))
    empty = boxes([])
    for matching, expected in (("hungarian", [1.0, 0.0]), ("visual_rft", [0.0, 0.0]), ("vlm_r1", [1.0, 0.0])):
        got = IoUReward(matching=matching).score(completions([empty, empty]), [negative, positive]).total
        assert got == expected, matching


def test_greedy_orders_differ_from_the_optimal_matching(make_record, completions):
    """Two ground-truth boxes, two answers: the first answer's best box is the second answer's only one.
    Optimal matching pairs them crosswise; Visual-RFT's answer-order greedy lets the first take it."""
    gt = boxes([[0, 0, 10, 10], [10, 0, 20, 10]])
    answer = boxes([[6, 0, 16, 10], [10, 0, 20, 10]])  # IoU with gt: (0.25, 3/7) and (0, 1)
    rec = [make_record(gt)]
    hungarian = IoUReward(matching="hungarian").score(completions([answer]), rec).total[0]
    greedy = IoUReward(matching="visual_rft", threshold=0.0).score(completions([answer]), rec).total[0]
    assert greedy == pytest.approx(
        visual_rft_reference([[6, 0, 16, 10], [10, 0, 20, 10]], [[0, 0, 10, 10], [10, 0, 20, 10]], 0.0)
    )
    assert hungarian == pytest.approx((0.25 + 1.0) / 2) and greedy == pytest.approx(3 / 7 / 2)


def test_matching_option_through_the_config_and_bad_values():
    built = build_rewards({"iou": 1.0}, {"iou": {"matching": "visual_rft"}}).rewards["iou"][1]
    assert built.matching == "visual_rft" and built.threshold == 0.5
    assert IoUReward().threshold == 0.0 and IoUReward(matching="vlm_r1", threshold=0.3).threshold == 0.3
    with pytest.raises(ValueError, match=r"rewards\.options\.iou: .*matching must be one of hungarian"):
        build_rewards({"iou": 1.0}, {"iou": {"matching": "greedy"}})
    with pytest.raises(ValueError, match="mode must be 'iou'"):
        IoUReward(mode="giou", matching="vlm_r1")
