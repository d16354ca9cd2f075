"""The trajectory reward's ``embodied_r1`` shaping against a reference re-written from Embodied-R1's published
reward code, and ``vertex`` against ``resampled`` evaluation on unequal vertex counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlm_grpoma.answers import Trajectory
from vlm_grpoma.rewards import build_rewards
from vlm_grpoma.rewards.trajectory import TrajectoryReward


def embodied_r1_reference(predict: list[list[float]], gt: list[list[float]]) -> float:
    """pickxiguapi/Embodied-R1 ``verl/utils/reward_score/embodiedr1.py``, ``embodiedr1_compute_score`` branch
    ``fsd_visual_trace`` with ``compute_discrete_frechet_distance``, ``compute_rmse_with_interpolation`` and
    ``distance_to_reward``, for an answer whose ``<point>`` tag parsed; without the 0.1 thinking-format term."""

    def frechet(t1, t2):
        n, m = len(t1), len(t2)
        d = np.zeros((n, m))
        for i in range(n):
            for j in range(m):
                d[i, j] = math.sqrt((t1[i][0] - t2[j][0]) ** 2 + (t1[i][1] - t2[j][1]) ** 2)
        dp = np.zeros((n, m))
        dp[0, 0] = d[0, 0]
        for i in range(1, n):
            dp[i, 0] = max(dp[i - 1, 0], d[i, 0])
        for j in range(1, m):
            dp[0, j] = max(dp[0, j - 1], d[0, j])
        for i in range(1, n):
            for j in range(1, m):
                dp[i, j] = max(min(dp[i - 1, j], dp[i, j - 1], dp[i - 1, j - 1]), d[i, j])
        return dp[n - 1, m - 1]

    def rmse_interp(t1, t2):
        target = max(len(t1), len(t2))
        a, b = np.array(t1), np.array(t2)
        s1, s2, new = np.linspace(0, 1, len(t1)), np.linspace(0, 1, len(t2)), np.linspace(0, 1, target)
        ax, ay = np.interp(new, s1, a[:, 0]), np.interp(new, s1, a[:, 1])
        bx, by = np.interp(new, s2, b[:, 0]), np.interp(new, s2, b[:, 1])
        return np.sqrt(np.sum((ax - bx) ** 2 + (ay - by) ** 2) / target)

    def to_reward(distance, low, high):
        if distance <= low:
            return 1.0
        if distance >= high:
            return 0.0
        return 1.0 - (distance - low) / (high - low)

    point_format, point_num, frechet_r, rmse_r = 1.0, 0.0, 0.0, 0.0
    if len(predict) == 8:
        point_num = 1.0
        frechet_r = to_reward(frechet(predict, gt), 10, 100)
        rmse_r = to_reward(rmse_interp(predict, gt), 5, 50)
    return 0.1 * point_format + 0.1 * point_num + 0.3 * frechet_r + 0.4 * rmse_r


def traj(points):
    return Trajectory(tuple(map(tuple, np.asarray(points, dtype=float).tolist())))


def random_pair(rng):
    gt = np.cumsum(rng.normal(0, 25, size=(int(rng.integers(2, 12)), 2)), axis=0) + 200
    count = 8 if rng.random() < 0.75 else int(rng.integers(2, 12))
    idx = np.linspace(0, len(gt) - 1, count)
    pred = np.stack([np.interp(idx, np.arange(len(gt)), gt[:, k]) for k in range(2)], axis=1)
    return pred + rng.normal(0, rng.choice([2.0, 20.0, 60.0]), size=pred.shape), gt


def test_embodied_r1_shaping_equals_its_published_reward(make_record, completions):
    rng = np.random.default_rng(36)
    pairs = [random_pair(rng) for _ in range(600)]
    answers = [traj(p) for p, _ in pairs]
    records = [make_record(traj(g), task="trajectory", width=640, height=480) for _, g in pairs]
    result = TrajectoryReward(shaping="embodied_r1").score(completions(answers), records)
    expected = [embodied_r1_reference(p.tolist(), g.tolist()) for p, g in pairs]
    assert result.total == pytest.approx(expected, abs=1e-12)
    shaped = np.array(result.total)
    assert (shaped > 0.1 + 1e-9).sum() > 100 and (np.array(result.components["point_num"]) == 0).sum() > 50
    assert shaped.max() <= 0.9 + 1e-12


def test_embodied_r1_needs_exactly_eight_points_and_measures_pixels(make_record, completions):
    gt = [[0, 0], [70, 0]]
    rec = make_record(traj(gt), task="trajectory", width=100, height=100)
    eight = [[10 * i, 0] for i in range(8)]  # the same segment, 8 vertices 10 px apart
    seven = [[70 * i / 6, 0] for i in range(7)]
    result = TrajectoryReward(shaping="embodied_r1").score(completions([traj(eight), traj(seven)]), [rec] * 2)
    # DFD on the vertices: 0..30 px pair with the first end, 40..70 with the second: 30 px -> 1 - 20 / 90;
    # RMSE: the ground truth interpolated by index to 8 points is the answer itself: 0 px -> 1
    assert result.components["frechet_dist"][0] == pytest.approx(30.0)
    assert result.components["rmse_dist"][0] == pytest.approx(0.0, abs=1e-12)
    assert result.total == pytest.approx([0.1 + 0.1 + 0.3 * (1 - 20 / 90) + 0.4, 0.1])
    assert result.components["point_num"] == [1.0, 0.0] and result.components["frechet"][1] == 0.0
    with pytest.raises(ValueError, match="evaluation must be 'vertex'"):
        TrajectoryReward(shaping="embodied_r1", evaluation="resampled")


def test_vertex_and_resampled_evaluation_differ_on_unequal_vertex_counts(make_record, completions):
    """A right angle answered with its 2 ends only: on the vertices the corner is 0.5 from both ends
    (normalised); resampled to 32 points by arc length both paths are walked together and the gap shrinks."""
    gt = [[0, 0], [100, 0], [100, 100]]
    rec = make_record(traj(gt), task="trajectory", width=100, height=100)
    answer = traj([[0, 0], [100, 100]])
    vertex = TrajectoryReward(evaluation="vertex").score(completions([answer]), [rec]).components
    resampled = TrajectoryReward(evaluation="resampled").score(completions([answer]), [rec]).components
    corner = math.sqrt(0.5**2 + 0.5**2)  # (1, 0) to the chord's midpoint, the nearest answer point
    assert vertex["hausdorff_dist"][0] == pytest.approx(1.0)  # the answer has no vertex near the corner
    assert resampled["hausdorff_dist"][0] == pytest.approx(corner, rel=0.05)
    # RMSE on the vertices: ground truth interpolated by index at 0, 0.5, 1 ... the answer at 3 points too
    mid = np.array([0.5, 0.5])
    assert vertex["rmse_dist"][0] == pytest.approx(math.sqrt(np.sum((mid - [1, 0]) ** 2) / 3))
    assert vertex["frechet_dist"][0] == pytest.approx(1.0)
    assert resampled["frechet_dist"][0] < vertex["frechet_dist"][0]


def test_equal_vertex_counts_give_plain_point_to_point_rmse(make_record, completions):
    """With equal counts vertex RMSE is the plain point-to-point RMSE (no interpolation)."""
    gt = np.array([[0.0, 0.0], [50.0, 10.0], [100.0, 0.0]])
    pred = gt + [[0, 5], [5, 0], [0, -5]]
    rec = make_record(traj(gt), task="trajectory", width=100, height=100)
    got = TrajectoryReward().score(completions([traj(pred)]), [rec]).components["rmse_dist"][0]
    assert got == pytest.approx(math.sqrt(np.mean(np.sum(((pred - gt) / 100) ** 2, axis=1))))


def test_options_through_the_config():
    built = build_rewards({"trajectory": 1.0}, {"trajectory": {"shaping": "embodied_r1"}}).rewards[
        "trajectory"
    ][1]
    assert built.shaping == "embodied_r1" and built.evaluation == "vertex"
    assert TrajectoryReward().evaluation == "vertex" and TrajectoryReward().shaping == "linear"
    with pytest.raises(ValueError, match=r"rewards\.options\.trajectory: .*evaluation must be one of vertex"):
        build_rewards({"trajectory": 1.0}, {"trajectory": {"evaluation": "dense"}})
    with pytest.raises(ValueError, match="shaping must be one of linear"):
        TrajectoryReward(shaping="embodied")
