"""The manipllm protocol: ManipLLM's camera, object state, settling under gravity, affordance pixels, the
demonstration, the approach with the hand's collision boxes, and episode specs that round-trip."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from vlm_grpoma.envs.sapien.camera import CameraSpec, raycast, sample_manipllm_camera
from vlm_grpoma.envs.sapien.gripper import FINGERTIP_REACH, SuctionGripper
from vlm_grpoma.envs.sapien.manipllm import (
    affordance_pixels,
    initial_state,
    sample_asset_episode,
    settle,
)
from vlm_grpoma.envs.sapien.protocol import MANIPLLM, SIMPLE
from vlm_grpoma.envs.sapien.scene import build_urdf_scene
from vlm_grpoma.envs.sapien.success import COLLECTION_RULE
from vlm_grpoma.envs.sapien.task import EpisodeSpec, execute, prepare


def _asset(assets, category):
    return next(a for a in assets if a.category == category)


def test_manipllm_camera_ranges():
    rng = np.random.default_rng(0)
    for _ in range(300):
        camera = sample_manipllm_camera(rng)
        position = np.array(camera.position)
        distance = np.linalg.norm(position)
        elevation = math.asin(position[2] / distance)
        azimuth = math.atan2(position[1], position[0]) % (2 * math.pi)
        assert camera.target == (0.0, 0.0, 0.0) and (camera.width, camera.height, camera.fovy_deg) == (
            336,
            336,
            35,
        )
        assert 4.5 <= distance <= 5.5 and math.pi / 6 <= elevation <= math.pi / 3
        assert 0.7 * math.pi <= azimuth <= 1.3 * math.pi  # in front of the object (it faces -x)


def test_initial_state_is_closed_four_times_in_five(generated_assets):
    built = prepare(replace(_spec(_asset(generated_assets, "StorageFurniture")), initial_qpos={}))
    rng = np.random.default_rng(1)
    states = [initial_state(rng, built) for _ in range(2000)]
    limits = {link.name: link.joint.limits for link in built.obj.movable}
    closed = np.mean([all(v == limits[k][0] for k, v in s.items()) for s in states])
    parts = len(limits)
    assert closed == pytest.approx(0.8 + 0.2 * 0.5**parts, abs=0.03)
    assert all(limits[k][0] <= v <= limits[k][1] for s in states for k, v in s.items())


def _spec(asset, protocol: str = "manipllm") -> EpisodeSpec:
    return EpisodeSpec(
        asset.category,
        0,
        sample_manipllm_camera(np.random.default_rng(0)),
        "",
        "",
        urdf=str(asset.urdf),
        protocol=protocol,
    )


def test_gravity_closes_a_lid_under_manipllm_only(generated_assets):
    box = _asset(generated_assets, "Box")
    for protocol, falls in (("manipllm", True), ("simple", False)):
        built = prepare(_spec(box, protocol))
        built.set_qpos({"link_0": 0.8})
        if falls:
            assert settle(built) and built.qpos()[0] < 0.01  # fell shut, then stayed still
        else:
            for _ in range(240):
                built.scene.step()
            assert built.qpos()[0] == pytest.approx(0.8, abs=1e-3)


def test_affordance_prefers_points_far_from_the_hinge(generated_assets):
    safe = _asset(generated_assets, "Safe")
    built = prepare(_spec(safe))
    camera = sample_manipllm_camera(np.random.default_rng(3))
    chosen = affordance_pixels(built, camera, stride=2)
    hits = [raycast(built, camera, *p) for p in chosen]
    assert len(chosen) > 20 and all(h is not None and h.link == "link_0" for h in hits)
    joint = built.obj.link("link_0").joint
    axis, origin = np.array(joint.axis), np.array(joint.origin)

    def lever(point):
        r = point - origin
        return np.linalg.norm(r - (r @ axis) * axis)

    door = [raycast(built, camera, x + 0.5, y + 0.5) for x in range(0, 336, 2) for y in range(0, 336, 2)]
    levers = [lever(h.point) for h in door if h is not None and h.link == "link_0"]
    cut = min(levers) + 0.6 * (max(levers) - min(levers))
    assert min(lever(h.point) for h in hits) >= cut - 1e-3  # only the outer 40 % of the door
    drawer = _asset(generated_assets, "Table")  # prismatic: every pixel of the drawer qualifies
    built = prepare(_spec(drawer))
    pixels = affordance_pixels(built, camera, stride=2)
    on_drawer = [
        p
        for p in ((x + 0.5, y + 0.5) for x in range(0, 336, 2) for y in range(0, 336, 2))
        if (h := raycast(built, camera, *p)) is not None and h.link == "link_0"
    ]
    assert len(pixels) == len(on_drawer) > 0


def test_sampled_episodes_follow_manipllm(generated_assets):
    for category in ("Refrigerator", "Table", "Toilet"):
        asset = _asset(generated_assets, category)
        spec, demo = sample_asset_episode(asset, 4)
        assert (spec, demo) == sample_asset_episode(asset, 4)  # deterministic
        assert spec.protocol == "manipllm" and 0.7 <= spec.scale <= 1.2 and spec.category == category
        built = prepare(spec)
        assert spec.urdf == str(asset.urdf) and set(spec.initial_qpos) == set(built.joint_index)
        hit = raycast(built, spec.camera, *demo.point)
        assert hit.link == spec.target_link and spec.target_label == asset.labels[spec.target_link]
        up = spec.camera.to_world(np.array(demo.up))
        assert up @ -hit.normal > 0.97  # the reversed normal plus ManipLLM's small noise
        assert abs(np.dot(demo.up, demo.forward)) < 1e-6
        outcome = execute(spec, demo)
        assert COLLECTION_RULE.judge(outcome.delta_q, outcome.joint_range, outcome.direction_cos, "pull")
        meta = json.loads(json.dumps(spec.to_meta()))
        assert meta["protocol"] == "manipllm" and EpisodeSpec.from_meta(meta) == spec


def test_old_meta_is_simple_and_manipllm_needs_a_urdf(generated_assets):
    spec, _ = sample_asset_episode(_asset(generated_assets, "Laptop"), 0)
    meta = spec.to_meta()
    del meta["protocol"]
    assert EpisodeSpec.from_meta(meta).protocol == "simple"
    with pytest.raises(ValueError, match="protocol"):
        EpisodeSpec.from_meta(spec.to_meta() | {"protocol": "where2act"})
    with pytest.raises(ValueError, match="URDF"):
        prepare(replace(spec, urdf=""))


@pytest.mark.parametrize("collision,reach", [(True, FINGERTIP_REACH), (False, 0.10)])
def test_approach_stops_where_the_fingertips_touch(generated_assets, collision, reach):
    """From 0.15 back along up to 0.10: the closed fingers (reaching 0.134) press on the surface and stop the
    hand there; a gripper without collision boxes goes all the way."""
    safe = _asset(generated_assets, "Safe")
    built = build_urdf_scene(safe.urdf, protocol=MANIPLLM)
    built.scene.step()
    lo, hi = built.bounds("link_0")
    centre = (lo + hi) / 2
    head_on = CameraSpec(tuple(centre - [3.0, 0.0, 0.0]), tuple(centre), 64, 64)
    hit = raycast(built, head_on, 32.0, 32.0)
    assert hit.link == "link_0" and hit.normal @ [-1.0, 0, 0] > 0.99
    point = hit.point  # on the door's front
    approach = np.array([1.0, 0.0, 0.0])
    gripper = SuctionGripper(
        built,
        point - 0.15 * approach,
        approach,
        150.0,
        forward=np.array([0, 0, 1.0]),
        collision=collision,
        material=MANIPLLM.material,
    )
    for i in range(1, 61):
        gripper.move_to(point - approach * (0.15 - 0.05 * min(1.0, i / 30)))
        built.scene.step()
    assert np.linalg.norm(gripper.position() - point) == pytest.approx(reach, abs=4e-3)
    assert built.qpos()[built.joint_index["link_0"]] == pytest.approx(0.0, abs=1e-3)  # pressed shut


def test_protocols_differ_only_where_documented():
    assert (SIMPLE.gravity, SIMPLE.approach, SIMPLE.gripper_collision, SIMPLE.pull_distance) == (
        False,
        None,
        False,
        0.3,
    )
    assert (MANIPLLM.gravity, MANIPLLM.approach, MANIPLLM.pull_distance, MANIPLLM.joint_damping) == (
        True,
        (0.15, 0.10),
        0.5,
        10.0,
    )
    assert SIMPLE.rule == MANIPLLM.rule and MANIPLLM.material == (4.0, 4.0, 0.01)
