"""Affordance reward on real mask files, boxes and points; distance shaping against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.answers import Box, Boxes, ParseError, Points, Trajectory
from vlm_grpoma.datasets.schema import MaskRef
from vlm_grpoma.rewards import build_reward
from vlm_grpoma.rewards.affordance import AffordanceReward, distance_to_boxes, linear_shape


def write_mask(path, inside: np.ndarray, mode="L"):
    img = Image.fromarray((inside * 255).astype(np.uint8), "L")
    img.convert(mode).save(path)
    return str(path)


@pytest.fixture
def square_mask(tmp_path):
    inside = np.zeros((48, 64), dtype=bool)  # H=48, W=64
    inside[10:20, 30:40] = True  # rows 10..19, cols 30..39
    return write_mask(tmp_path / "m.png", inside), inside


def test_mask_fraction_inside(square_mask, make_record, completions):
    path, _ = square_mask
    rec = make_record(MaskRef(path), task="affordance", width=64, height=48)
    answers = [
        Points(((35, 15),)),  # inside
        Points(((35, 15), (0, 0), (39.99, 19.99), (40, 15))),  # in, out, in (last pixel), out (next pixel)
        Points(((-5, 15), (100, 15), (35, 60))),  # off the image
    ]
    result = AffordanceReward().score(completions(answers), [rec] * 3)
    assert result.total == pytest.approx([1.0, 0.5, 0.0])
    assert result.components["in_region"] == result.total


def test_mask_distance_component_matches_brute_force(square_mask, make_record, completions):
    path, inside = square_mask
    rec = make_record(MaskRef(path), task="affordance", width=64, height=48)
    reward = AffordanceReward(r_in=1.0, r_out=20.0, reference_diagonal=float(np.hypot(64, 48)))
    rng = np.random.default_rng(0)
    pts = rng.uniform([0, 0], [64, 48], size=(200, 2))
    result = reward.score(completions([Points((tuple(p),)) for p in pts]), [rec] * len(pts))
    rows, cols = np.nonzero(inside)
    for p, got in zip(pts, result.components["distance"]):
        c, r = np.floor(p)
        d = np.hypot(rows - r, cols - c).min()
        assert got == pytest.approx(float(np.clip((20.0 - d) / 19.0, 0, 1)), abs=1e-5)


def test_points_on_and_just_beyond_the_image_border(tmp_path, make_record, completions):
    """A point in pixel column W (x in [W, W+1)) is off the image even when the last column is in the mask,
    and an off-image point's distance is the border pixel's plus the Euclidean step to it (exact here: the
    mask holds the right column and the bottom-right corner)."""
    inside = np.zeros((48, 64), dtype=bool)
    inside[:, 63] = True
    path = write_mask(tmp_path / "edge.png", inside)
    rec = make_record(MaskRef(path), task="affordance", width=64, height=48)
    reward = AffordanceReward(r_in=0.0, r_out=10.0, reference_diagonal=float(np.hypot(64, 48)))
    points = [(63.99, 20), (64.0, 20), (66.5, 20), (63.5, 47.99), (63.5, 48.0), (66.2, 51.7)]
    result = reward.score(completions([Points((p,)) for p in points]), [rec] * len(points))
    assert result.components["in_region"] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    # distances 0, 1, 3, 0, 1 (row 48 to row 47) and hypot(3, 4) = 5 from the corner pixel
    assert result.components["distance"] == pytest.approx([1.0, 0.9, 0.7, 1.0, 0.9, 0.5])


def test_masks_are_cached_per_path(square_mask, make_record, completions, tmp_path):
    path, inside = square_mask
    rec = make_record(MaskRef(path), task="affordance", width=64, height=48)
    reward = AffordanceReward()
    assert reward.score(completions([Points(((35, 15),))]), [rec]).total == [1.0]
    write_mask(path, np.zeros_like(inside))  # changing the file does not matter once loaded
    assert reward.score(completions([Points(((35, 15),))]), [rec]).total == [1.0]
    assert len(reward.masks) == 1
    assert AffordanceReward().score(completions([Points(((35, 15),))]), [rec]).total == [0.0]  # fresh cache


def test_mask_cache_evicts_least_recently_used(tmp_path, make_record, completions):
    inside = np.ones((48, 64), dtype=bool)
    recs = [
        make_record(
            MaskRef(write_mask(tmp_path / f"{i}.png", inside)), task="affordance", width=64, height=48
        )
        for i in range(5)
    ]
    one_mask = 48 * 64 * 5  # bool + float32 distances
    reward = AffordanceReward(mask_cache_mb=2.5 * one_mask / 2**20)
    reward.score(completions([Points(((1, 1),))] * 5), recs)
    assert len(reward.masks) == 2


def test_rgb_and_rgba_masks(tmp_path, make_record, completions):
    inside = np.zeros((48, 64), dtype=bool)
    inside[:, :32] = True
    for mode in ("RGB", "RGBA", "1"):
        path = write_mask(tmp_path / f"m_{mode}.png", inside, mode)
        rec = make_record(MaskRef(path), task="affordance", width=64, height=48)
        result = AffordanceReward().score(completions([Points(((10, 10), (50, 10)))]), [rec])
        assert result.total == [0.5], mode


def test_missing_or_mis_sized_mask_is_a_data_error(tmp_path, square_mask, make_record, completions):
    rec = make_record(MaskRef(str(tmp_path / "nope.png")), task="affordance", rid="rec-42")
    with pytest.raises(FileNotFoundError, match="record rec-42.*nope.png"):
        AffordanceReward().score(completions([Points(((1, 1),))]), [rec])
    rec = make_record(MaskRef(square_mask[0]), task="affordance", width=640, height=480, rid="rec-43")
    with pytest.raises(ValueError, match="record rec-43.*64x48.*640x480"):
        AffordanceReward().score(completions([Points(((1, 1),))]), [rec])
    rec = make_record(Trajectory(((0, 0), (1, 1))), task="affordance", rid="rec-44")
    with pytest.raises(ValueError, match="record rec-44"):
        AffordanceReward().score(completions([Points(((1, 1),))]), [rec])


def test_box_ground_truth(make_record, completions):
    rec = make_record(Boxes((Box(0, 0, 10, 10), Box(20, 20, 30, 30))), task="affordance")
    answers = [Points(((5, 5), (25, 25))), Points(((10, 10), (15, 15))), Points(((15, 15),))]
    result = AffordanceReward().score(completions(answers), [rec] * 3)
    assert result.total == [1.0, 0.5, 0.0]
    # (15, 15) is 5*sqrt(2) from both boxes; 640x480 has the reference diagonal, so radii are 10 / 50 px
    assert result.components["distance"][2] == pytest.approx(1.0)
    pts, boxes = np.array([[15.0, 40.0], [-3.0, 5.0]]), np.array([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    np.testing.assert_allclose(distance_to_boxes(pts, boxes), [np.hypot(5, 10), 3.0])


def test_point_ground_truth_linear_shaping_scaled_by_diagonal(make_record, completions):
    gt = Points(((100, 100), (400, 300)))
    rec = make_record(gt, task="affordance", width=640, height=480)  # diagonal 800 = reference
    answers = [Points(((100 + d, 100),)) for d in (0, 10, 30, 50, 80)] + [Points(((400, 290), (100, 150)))]
    result = AffordanceReward(r_in=10, r_out=50).score(completions(answers), [rec] * 6)
    assert result.total == pytest.approx([1, 1, 0.5, 0, 0, 0.5])
    assert result.components["in_region"] == pytest.approx([1, 1, 0, 0, 0, 0.5])
    big = make_record(Points(((200, 200),)), task="affordance", width=1280, height=960)  # radii doubled
    result = AffordanceReward(r_in=10, r_out=50).score(completions([Points(((260, 200),))]), [big])
    assert result.total == pytest.approx([0.5])
    assert linear_shape(np.array([0.0, 5.0, 7.0, 9.0]), 5.0, 9.0).tolist() == [1.0, 1.0, 0.5, 0.0]


def test_parse_errors_score_zero(make_record, completions):
    rec = make_record(Points(((1, 1),)), task="affordance")
    answers = [ParseError("no_points"), Boxes(()), Points(((1, 1),))]
    result = build_reward("affordance").score(completions(answers), [rec] * 3)
    assert result.total == [0.0, 0.0, 1.0]
    assert result.failures == {"no_points": 1, "wrong_kind": 1}
    with pytest.raises(ValueError, match="r_in"):
        AffordanceReward(r_in=5, r_out=5)


def test_fuzz_finite_and_in_range(square_mask, make_record, completions):
    rng = np.random.default_rng(1)
    gts = [MaskRef(square_mask[0]), Boxes((Box(1, 2, 30, 40),)), Points(((3, 4), (60, 40)))]
    answers, records = [], []
    for i in range(3000):
        scale = rng.choice([1.0, 100.0, 1e6])
        pts = rng.uniform(-1, 1, size=(int(rng.integers(1, 20)), 2)) * scale + 32
        answers.append(Points(tuple(map(tuple, pts))) if i % 7 else ParseError("bad_shape"))
        records.append(make_record(gts[i % 3], task="affordance", width=64, height=48))
    result = AffordanceReward().score(completions(answers), records)
    for values in [result.total, *result.components.values()]:
        v = np.asarray(values)
        assert np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()
    assert result.failures == {"bad_shape": sum(1 for i in range(3000) if i % 7 == 0)}
