"""URDF emit/load: an object loaded through its URDF matches the directly built one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from vlm_grpoma.envs.sapien.camera import raycast, raycast_image
from vlm_grpoma.envs.sapien.objects import make_object
from vlm_grpoma.envs.sapien.scene import build_scene
from vlm_grpoma.envs.sapien.task import EpisodeSpec, execute, prepare, sample_episode
from vlm_grpoma.envs.sapien.urdf import joint_frictions, prepare_urdf, to_urdf


def sample_urdf_episode(urdf_path, episode_seed):
    """An episode on a URDF object, category ``urdf:<folder>`` (what ManipLLM's asset loader does for its
    PartNet-Mobility folders)."""
    path = Path(urdf_path).resolve()
    return sample_episode(f"urdf:{path.parent.name}", 0, episode_seed, urdf=str(path))


@pytest.mark.parametrize("category,seed", [("drawer_cabinet", 3), ("trash_can", 8), ("refrigerator", 2)])
def test_urdf_round_trip_matches_direct_build(category, seed):
    obj = make_object(category, seed)
    text = to_urdf(obj)
    physics_only = prepare_urdf(text, render=False)
    assert "<visual" in text and "<visual" not in physics_only and "<collision" in physics_only
    assert joint_frictions(text) == pytest.approx({link.name: link.joint.friction for link in obj.movable})
    direct, loaded = build_scene(obj), build_scene(obj, via_urdf=True)
    assert direct.joint_index == loaded.joint_index
    for a, b in zip(direct.articulation.get_active_joints(), loaded.articulation.get_active_joints()):
        assert a.type.startswith(b.type.replace("_unwrapped", ""))
        assert np.allclose(a.limits, b.limits) and np.isclose(a.friction, b.friction)
    for name in direct.link_components:
        assert np.isclose(direct.link_components[name].mass, loaded.link_components[name].mass, rtol=1e-4)
    half_open = {link.name: 0.5 * link.joint.limits[1] for link in obj.movable}
    for built in (direct, loaded):
        built.set_qpos(half_open)
        built.scene.step()
    for name in direct.link_components:
        (ra, ta), (rb, tb) = direct.link_pose(name), loaded.link_pose(name)
        assert np.allclose(ra, rb, atol=1e-4) and np.allclose(ta, tb, atol=1e-4)
    # same geometry (box sizes, cylinder orientations) seen through the same camera
    spec, _ = sample_episode(category, seed, 0, width=96, height=96)
    depth_a, links_a = raycast_image(direct, spec.camera, stride=3)
    depth_b, links_b = raycast_image(loaded, spec.camera, stride=3)
    assert (links_a == links_b).mean() > 0.99
    both = np.isfinite(depth_a) & np.isfinite(depth_b)
    assert np.abs(depth_a[both] - depth_b[both]).max() < 1e-3


PARTNET_LIKE = """<?xml version="1.0"?>
<robot name="partnet_like">
  <link name="base"/>
  <link name="link_1">
    <visual><geometry><mesh filename="textured_objs/missing.obj"/></geometry></visual>
    <collision><origin xyz="0 0 0.4"/><geometry><box size="0.5 0.6 0.8"/></geometry></collision>
  </link>
  <link name="link_0">
    <collision><origin xyz="-0.01 0.3 0"/><geometry><box size="0.02 0.6 0.76"/></geometry></collision>
  </link>
  <link name="link_0_handle">
    <collision><origin xyz="-0.05 0.5 0" rpy="0 0 0"/><geometry><cylinder radius="0.012" length="0.25"/></geometry>
    </collision>
  </link>
  <joint name="fixed_base" type="fixed"><parent link="base"/><child link="link_1"/></joint>
  <joint name="joint_0" type="revolute">
    <origin xyz="-0.25 -0.3 0.4"/><axis xyz="0 0 1"/><parent link="link_1"/><child link="link_0"/>
    <limit lower="0" upper="1.8" effort="10" velocity="1"/><dynamics damping="1.0" friction="0.2"/>
  </joint>
  <joint name="handle_fixed" type="fixed"><parent link="link_0"/><child link="link_0_handle"/></joint>
</robot>
"""


def test_partnet_like_urdf_episodes(tmp_path):
    path = tmp_path / "7128" / "mobility.urdf"
    path.parent.mkdir()
    path.write_text(PARTNET_LIKE)  # a visual mesh that does not exist: physics-only loading must strip it
    successes = []
    for episode in range(4):
        spec, oracle = sample_urdf_episode(path, episode)
        assert spec.category == "urdf:7128" and spec.target_link == "link_0" and spec.urdf == str(path)
        assert EpisodeSpec.from_meta(spec.to_meta()) == spec
        successes.append(execute(spec, oracle).success)
    assert all(successes)
    built = prepare(spec)
    assert built.owner == {"base": "base", "link_1": "base", "link_0": "link_0", "link_0_handle": "link_0"}
    assert built.articulation.get_active_joints()[0].friction == pytest.approx(0.2)
    handle = np.array([-0.3, 0.2, 0.4])  # the handle bar's front, in the world (hinge at y = -0.3)
    pixel = spec.camera.project(handle[None])[0]
    hit = raycast(built, spec.camera, *pixel)
    if hit is not None and hit.link == "link_0":  # the handle counts as the door it is fixed to
        assert execute(spec, replace(oracle, point=tuple(pixel))).failure == ""
    top = spec.camera.project(np.array([[0.0, 0.0, 0.8]]))[0]
    assert execute(spec, replace(oracle, point=tuple(top))).failure == "non_movable"


@pytest.mark.parametrize("category", ["drawer_cabinet", "oven", "laptop"])
def test_emitted_urdf_as_a_kinematics_only_object(tmp_path, category):
    path = tmp_path / category / "mobility.urdf"
    path.parent.mkdir()
    path.write_text(to_urdf(make_object(category, 21)))
    outcomes = [execute(*sample_urdf_episode(path, episode)) for episode in range(4)]
    assert sum(o.success for o in outcomes) >= 3  # the generic oracle (no part labels, no handles)
