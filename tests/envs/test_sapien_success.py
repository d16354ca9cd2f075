"""The manipulation success rule: each threshold on both sides, the cosine's sign, the primitive; and
physics episodes that land just above and below the move threshold or move against the pull."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vlm_grpoma.envs.sapien.camera import raycast
from vlm_grpoma.envs.sapien.manipllm import affordance_pixels, demonstration, sample_asset_episode
from vlm_grpoma.envs.sapien.success import COLLECTION_RULE, TEST_RULE, SuccessRule, direction_cosine
from vlm_grpoma.envs.sapien.task import ExecConfig, execute, prepare, sample_episode

EPS = 1e-6
WIDE = 2.0  # a joint range for which half the range never decides


@pytest.mark.parametrize(
    "delta_q,expected",
    [(0.03 - EPS, False), (0.03, False), (0.03 + EPS, True), (-(0.03 + EPS), True), (-(0.03 - EPS), False)],
)
def test_move_threshold_both_sides_and_either_sign(delta_q, expected):
    assert TEST_RULE.judge(delta_q, WIDE, 1.0, "pull") is expected
    assert TEST_RULE.judge(delta_q, WIDE, -1.0, "push") is expected  # a push ignores the direction


@pytest.mark.parametrize("fraction,expected", [(0.5 - 1e-3, False), (0.5, False), (0.5 + 1e-3, True)])
def test_half_the_range_counts_for_short_joints(fraction, expected):
    joint_range = 0.04  # half of it (0.02) is below the move threshold, so only the range rule decides
    assert TEST_RULE.judge(fraction * joint_range, joint_range, 1.0, "pull") is expected


@pytest.mark.parametrize("cosine,expected", [(0.3 - EPS, False), (0.3, False), (0.3 + EPS, True)])
def test_direction_threshold_both_sides(cosine, expected):
    assert TEST_RULE.judge(0.5, WIDE, cosine, "pull") is expected
    assert TEST_RULE.judge(0.5, WIDE, cosine, "push") is True


@pytest.mark.parametrize("cosine", [-1.0, -0.9, -0.3 - EPS])
def test_a_pull_that_moves_the_point_backwards_fails(cosine):
    assert not TEST_RULE.judge(0.5, WIDE, cosine, "pull")
    assert not COLLECTION_RULE.judge(0.5, WIDE, cosine, "pull")


def test_collection_rule_is_manipllms_stricter_one():
    assert COLLECTION_RULE == SuccessRule(0.1, 0.5, 0.5)
    assert not COLLECTION_RULE.judge(0.1 - EPS, WIDE, 1.0, "pull") and COLLECTION_RULE.judge(
        0.1 + EPS, WIDE, 1.0, "pull"
    )
    assert not COLLECTION_RULE.judge(0.5, WIDE, 0.5 - EPS, "pull") and COLLECTION_RULE.judge(
        0.5, WIDE, 0.5 + EPS, "pull"
    )


def test_direction_cosine_matches_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(50):
        start, end, intended = rng.normal(size=(3, 3))
        moved = end - start
        reference = moved @ intended / (np.linalg.norm(moved) * np.linalg.norm(intended))
        assert direction_cosine(start, end, intended) == pytest.approx(reference)
        assert direction_cosine(end, start, intended) == pytest.approx(-reference)  # the sign is kept
    assert direction_cosine(np.ones(3), np.ones(3), np.array([1.0, 0, 0])) == 0.0  # no motion, no direction
    assert direction_cosine(np.zeros(3), np.array([0.0, -2.0, 0.0]), np.array([0.0, 0.5, 0.0])) == -1.0


@pytest.fixture(scope="module")
def drawer_episode():
    spec, oracle = sample_episode("drawer_cabinet", 1_000_004, 2)
    assert spec.target_link.startswith("drawer")
    return spec, oracle


@pytest.mark.parametrize("pull,expected", [(0.024, False), (0.038, True)])
def test_physics_pull_just_below_and_above_the_move_threshold(drawer_episode, pull, expected):
    spec, oracle = drawer_episode
    outcome = execute(spec, oracle, ExecConfig(pull_distance=pull))
    assert outcome.failure == "" and outcome.joint_range > 4 * 0.038  # the range rule cannot decide
    assert (outcome.delta_q > 0.03) is expected and abs(outcome.delta_q - pull) < 0.005
    assert outcome.direction_cos > 0.99 and outcome.success is expected


def test_physics_point_moving_against_the_pull_fails(generated_assets):
    """Under gravity a half-open lid that a too weak arm cannot hold falls shut while its top face is
    pulled (opened): the joint moves a lot, the contact point moves against the pull, and that fails."""
    box = next(a for a in generated_assets if a.category == "Box")
    spec, _ = sample_asset_episode(box, 3)
    opened = replace(spec, initial_qpos={spec.target_link: 0.4})
    built = prepare(opened)
    hits = [raycast(built, opened.camera, *pixel) for pixel in affordance_pixels(built, opened.camera)]
    top = max((h for h in hits if h.link == spec.target_link), key=lambda h: h.normal[2])
    assert top.normal[2] > 0.8  # the lid's top face: pulling along its normal opens the lid
    pixel = opened.camera.project(top.point[None])[0]
    pull = demonstration(np.random.default_rng(0), opened.camera, pixel, top.normal)
    weak = execute(opened, pull, ExecConfig(max_force=0.5))
    assert weak.failure == "" and weak.delta_q > 0.3 and weak.direction_cos < -0.9
    assert not weak.success
