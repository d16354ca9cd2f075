"""Procedural objects: determinism, splits, joint geometry, and the built SAPIEN articulation."""

from __future__ import annotations

import numpy as np
import pytest

from vlm_grpoma.envs.sapien.objects import (
    ASSET_ONLY_CATEGORIES,
    GENERATORS,
    HELD_OUT_SEED_START,
    SEEN_CATEGORIES,
    UNSEEN_CATEGORIES,
    instance_seed,
    joint_transform,
    make_object,
    split_categories,
)
from vlm_grpoma.envs.sapien.scene import build_scene
from vlm_grpoma.envs.sapien.task import opening_direction

LABELS = {"body", "drawer", "door", "lid", "screen", "handle"}


def test_categories_and_splits():
    assert len(SEEN_CATEGORIES) >= 6 and len(UNSEEN_CATEGORIES) >= 4
    assert not set(SEEN_CATEGORIES) & set(UNSEEN_CATEGORIES)
    assert set(SEEN_CATEGORIES) | set(UNSEEN_CATEGORIES) | set(ASSET_ONLY_CATEGORIES) == set(GENERATORS)
    assert not (set(SEEN_CATEGORIES) | set(UNSEEN_CATEGORIES)) & set(ASSET_ONLY_CATEGORIES)
    assert split_categories("train") == split_categories("seen") == SEEN_CATEGORIES
    assert split_categories("unseen") == UNSEEN_CATEGORIES
    train = {instance_seed("train", i, 0) for i in range(200)}
    seen = {instance_seed("seen", i, 0) for i in range(200)}
    assert max(train) < HELD_OUT_SEED_START <= min(seen)
    assert instance_seed("seen", 5, 3) == instance_seed("seen", 5, 3) != instance_seed("seen", 5, 4)
    with pytest.raises(ValueError, match="unknown split"):
        split_categories("val")
    with pytest.raises(KeyError, match="unknown object category"):
        make_object("teapot", 0)


@pytest.mark.parametrize("category", sorted(GENERATORS))
def test_objects_are_seeded_and_well_formed(category):
    a, b, c = make_object(category, 11), make_object(category, 11), make_object(category, 12)
    assert a == b and a != c
    lo, hi = a.bounds()
    assert 0.69 <= float(np.max(hi - lo)) <= 1.21  # ManipLLM's scale range of a unit object
    assert a.links[0].joint is None and a.movable
    for link in a.links:
        assert link.shapes and {s.label for s in link.shapes} <= LABELS
    for link in a.movable:
        j = link.joint
        assert j.limits[0] == 0 < j.limits[1] and np.isclose(np.linalg.norm(j.axis), 1)
        assert j.friction >= 0 and j.damping > 0
        # opening direction agrees with a finite difference of the joint transform, and opening moves the
        # part outwards (towards the camera side, -x) or upwards
        point = np.array(link.shapes[-1].pos)
        rot, trans = joint_transform(j, 1e-4)
        fd = (rot @ point + trans - point) / 1e-4
        assert np.allclose(fd / np.linalg.norm(fd), opening_direction(link, point), atol=1e-3)
        rot, trans = joint_transform(j, j.limits[1])
        moved = rot @ point + trans - point
        assert np.linalg.norm(moved) > 0.05 and (moved[0] < -0.02 or moved[2] > 0.02)


def test_built_articulation_matches_the_spec():
    obj = make_object("drawer_cabinet", 4)
    built = build_scene(obj)
    assert list(built.link_components) == [link.name for link in obj.links]
    for joint in built.articulation.get_active_joints():
        spec = obj.link(joint.child_link.name).joint
        assert joint.type == spec.type
        assert np.allclose(joint.limits, [spec.limits], atol=1e-6)
        assert np.isclose(joint.friction, spec.friction, rtol=1e-5)  # set on the built joint
        assert np.isclose(joint.damping, spec.damping, rtol=1e-5)
    built.scene.step()
    drawer = obj.movable[0]
    handle = next(s for s in drawer.shapes if s.label == "handle")
    assert built.label_at(drawer.name, np.array(handle.pos)) == "handle"
    assert built.label_at("body", np.zeros(3) + [0, 0, 0.05]) == "body"
    # moving the joint moves the link by the analytic joint transform
    built.set_qpos({drawer.name: 0.1})
    built.scene.step()
    rot, trans = built.link_pose(drawer.name)
    assert np.allclose(trans - np.array(drawer.joint.origin), np.array(drawer.joint.axis) * 0.1, atol=1e-4)
