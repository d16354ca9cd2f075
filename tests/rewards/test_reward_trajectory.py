"""Trajectory metrics against scipy and a test-local Fréchet DP; reward shaping and robustness."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import directed_hausdorff

from vlm_grpoma.answers import ParseError, Points, Trajectory
from vlm_grpoma.rewards import build_reward
from vlm_grpoma.rewards.trajectory import (
    TrajectoryReward,
    frechet_from_distances,
    hausdorff_from_distances,
    pairwise_distances,
    resample_normalised,
    resample_polyline,
    rmse,
)


def discrete_frechet(a, b):
    """Discrete Fréchet distance of polylines a [..., N, 2] and b [..., M, 2], as the reward computes it."""
    return frechet_from_distances(pairwise_distances(a, b))


def hausdorff(a, b):
    """Symmetric Hausdorff distance of point sets a [..., N, 2] and b [..., M, 2], as the reward computes it."""
    return hausdorff_from_distances(pairwise_distances(a, b))


def frechet_reference(p, q):
    """Textbook Eiter–Mannila discrete Fréchet, one cell at a time."""
    n, m = len(p), len(q)
    ca = np.zeros((n, m))
    for i in range(n):
        for j in range(m):
            d = np.linalg.norm(p[i] - q[j])
            if i == 0 and j == 0:
                ca[i, j] = d
            elif i == 0:
                ca[i, j] = max(ca[i, j - 1], d)
            elif j == 0:
                ca[i, j] = max(ca[i - 1, j], d)
            else:
                ca[i, j] = max(min(ca[i - 1, j], ca[i - 1, j - 1], ca[i, j - 1]), d)
    return ca[-1, -1]


def test_frechet_matches_reference_on_random_polylines():
    rng = np.random.default_rng(0)
    for _ in range(100):
        p, q = rng.normal(size=(rng.integers(1, 12), 2)), rng.normal(size=(rng.integers(1, 12), 2))
        assert discrete_frechet(p, q) == pytest.approx(frechet_reference(p, q), abs=1e-12)


def test_frechet_batched_equals_single():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(20, 7, 2)), rng.normal(size=(20, 5, 2))
    batched = discrete_frechet(a, b)
    assert batched.shape == (20,)
    np.testing.assert_allclose(batched, [frechet_reference(x, y) for x, y in zip(a, b)])


def test_frechet_depends_on_direction_hausdorff_does_not():
    line = np.stack([np.linspace(0, 1, 10), np.zeros(10)], axis=1)
    assert discrete_frechet(line, line[::-1]) == pytest.approx(1.0)
    assert hausdorff(line, line[::-1]) == pytest.approx(0.0)


def test_hausdorff_matches_scipy():
    rng = np.random.default_rng(2)
    for _ in range(100):
        p, q = rng.normal(size=(rng.integers(1, 20), 2)), rng.normal(size=(rng.integers(1, 20), 2))
        expected = max(directed_hausdorff(p, q)[0], directed_hausdorff(q, p)[0])
        assert hausdorff(p, q) == pytest.approx(expected, abs=1e-12)


def test_rmse_by_hand():
    a = np.array([[0.0, 0.0], [1.0, 0.0]])
    b = np.array([[0.0, 3.0], [1.0, 4.0]])
    assert rmse(a, b) == pytest.approx(np.sqrt((9 + 16) / 2))


def test_resample_by_arc_length():
    poly = np.array([[0.0, 0.0], [3.0, 0.0], [3.0, 1.0]])  # length 4
    r = resample_polyline(poly, 5)
    np.testing.assert_allclose(r, [[0, 0], [1, 0], [2, 0], [3, 0], [3, 1]])
    # inserting collinear and duplicate vertices does not change the resampled polyline
    dense = np.array([[0.0, 0.0], [0.0, 0.0], [1.5, 0.0], [3.0, 0.0], [3.0, 0.5], [3.0, 1.0]])
    np.testing.assert_allclose(resample_polyline(dense, 5), r, atol=1e-12)
    np.testing.assert_allclose(resample_polyline(np.array([[2.0, 2.0], [2.0, 2.0]]), 3), [[2, 2]] * 3)
    wiggly = np.random.default_rng(3).normal(size=(7, 2))
    step = np.linalg.norm(np.diff(wiggly, axis=0), axis=1).sum() / 49
    chords = np.linalg.norm(np.diff(resample_polyline(wiggly, 50), axis=0), axis=1)
    assert chords.max() == pytest.approx(step)  # straight stretches: chord = arc-length step
    assert (chords <= step * (1 + 1e-9)).all()  # around a corner the chord is shorter, never longer


def test_resample_batched_and_grouped_equal_single():
    rng = np.random.default_rng(5)
    polys = [rng.normal(size=(int(rng.integers(2, 9)), 2)) * 50 for _ in range(40)]
    polys[3] = np.repeat(polys[3][:1], 4, axis=0)  # zero length
    sizes = rng.uniform(50, 500, size=(40, 2))
    grouped = resample_normalised([list(map(tuple, p)) for p in polys], sizes, 11, chunk=3)
    for got, poly, size in zip(grouped, polys, sizes):
        np.testing.assert_allclose(got, resample_polyline(poly / size, 11), atol=1e-12)
    same_len = np.stack([p[:2] for p in polys])
    np.testing.assert_allclose(resample_polyline(same_len, 5), [resample_polyline(p, 5) for p in same_len])


def make_traj(points):
    return Trajectory(tuple(map(tuple, points)))


def test_reward_identical_and_shifted(make_record, completions):
    gt = np.array([[10.0, 10.0], [100.0, 50.0], [150.0, 150.0]])
    rec = make_record(make_traj(gt), task="trajectory", width=200, height=200)
    shifted = gt + [20.0, 0.0]  # 0.1 in normalised x: every metric is 0.1
    result = TrajectoryReward(max_distance=0.5).score(
        completions([make_traj(gt), make_traj(shifted)]), [rec] * 2
    )
    assert result.total == pytest.approx([1.0, 0.8])
    for metric in ("frechet", "hausdorff", "rmse"):
        assert result.components[metric] == pytest.approx([1.0, 0.8])
        assert result.components[f"{metric}_dist"] == pytest.approx([0.0, 0.1])


def test_reward_weights_and_normalisation(make_record, completions):
    gt = np.array([[0.0, 0.0], [100.0, 0.0]])
    rec = make_record(make_traj(gt), task="trajectory", width=100, height=50)
    reversed_ = make_traj(gt[::-1])  # Fréchet 1.0 (normalised), Hausdorff 0
    only_h = TrajectoryReward(frechet_weight=0, rmse_weight=0)
    only_f = TrajectoryReward(hausdorff_weight=0, rmse_weight=0, max_distance=2.0)
    assert only_h.score(completions([reversed_]), [rec]).total == pytest.approx([1.0])
    assert only_f.score(completions([reversed_]), [rec]).total == pytest.approx([0.5])
    # y is normalised by the height: a 5 px shift on a 50 px image is 0.1
    down = make_traj(gt + [0.0, 5.0])
    assert only_h.score(completions([down]), [rec]).components["hausdorff_dist"] == pytest.approx([0.1])


def test_reward_failures_and_bad_data(make_record, completions):
    rec = make_record(make_traj([[0, 0], [10, 10]]), task="trajectory")
    answers = [ParseError("too_few_points"), Points(((1, 1),)), make_traj([[0, 0], [10, 10]])]
    result = build_reward("trajectory").score(completions(answers), [rec] * 3)
    assert result.total == pytest.approx([0.0, 0.0, 1.0])
    assert result.failures == {"too_few_points": 1, "wrong_kind": 1}
    assert result.components["frechet_dist"][:2] == pytest.approx([np.sqrt(2)] * 2)
    bad = make_record(Points(((1, 1),)), task="trajectory", rid="traj-9")
    with pytest.raises(ValueError, match="record traj-9"):
        TrajectoryReward().score(completions([answers[2]]), [bad])
    with pytest.raises(ValueError, match="weights"):
        TrajectoryReward(frechet_weight=0, hausdorff_weight=0, rmse_weight=0)
    assert TrajectoryReward().score([], []).total == []


def test_fuzz_finite_and_in_range(make_record, completions):
    rng = np.random.default_rng(4)
    answers, records = [], []
    for i in range(2000):
        scale = rng.choice([1e-9, 1.0, 1e3, 1e7])
        pts = rng.normal(size=(int(rng.integers(2, 60)), 2)) * scale
        if i % 5 == 0:
            pts[:] = pts[0]  # a trajectory that never moves
        answers.append(make_traj(pts) if i % 9 else ParseError("invalid_json"))
        gt = rng.uniform(0, 100, size=(int(rng.integers(2, 10)), 2))
        records.append(make_record(make_traj(gt), task="trajectory", width=100, height=100))
    result = TrajectoryReward().score(completions(answers), records)
    assert np.isfinite(result.total).all() and min(result.total) >= 0 and max(result.total) <= 1
    for name, values in result.components.items():
        v = np.asarray(values)
        assert np.isfinite(v).all() and (v >= 0).all(), name
        if not name.endswith("_dist"):
            assert (v <= 1).all(), name
