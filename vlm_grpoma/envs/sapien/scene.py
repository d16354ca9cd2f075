"""Build a SAPIEN 3 scene holding one articulated object: a procedural one, or any URDF file.

Physics-only by default (``PhysxCpuSystem`` alone needs no Vulkan device); visuals and a ``RenderSystem``
are added only when ``render=True``. Under the ``simple`` protocol object links ignore gravity (doors, lids
and drawers are treated as counter-balanced), so a part stays where the gripper leaves it and closed parts
stay closed; the ``manipllm`` protocol keeps gravity and sets ManipLLM's joint and contact physics.

A URDF object (e.g. PartNet-Mobility's ``mobility.urdf``) is described by its kinematics only: each link
with a revolute, continuous or prismatic joint is a part (labelled by ``semantics.txt`` where the folder has
one, else by its link name), and links attached through fixed joints (a handle on a door, the base under a
body) move with, and count as, the part they hang from.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlm_grpoma.envs.sapien.objects import (
    ArticulatedObject,
    Joint,
    Link,
    link_frame,
    quat_to_matrix,
    quat_x_to,
    shape_contains,
)
from vlm_grpoma.envs.sapien.partnet import link_labels
from vlm_grpoma.envs.sapien.protocol import SIMPLE, Protocol
from vlm_grpoma.envs.sapien.urdf import load_articulation, to_urdf
from vlm_grpoma.envs.sapien.vulkan import import_sapien

TIMESTEP = 1 / 240
DENSITY = 250.0  # kg/m^3, light wood-like parts


@dataclass
class BuiltScene:
    """A live scene plus the lookups the task code needs."""

    scene: object  # sapien.Scene
    obj: ArticulatedObject
    articulation: object  # sapien.physx.PhysxArticulation
    link_components: dict[str, object]  # every link name -> PhysxArticulationLinkComponent
    joint_index: dict[str, int]  # movable part (link name) -> index into qpos
    owner: dict[str, str]  # every link name -> the part it moves with (itself for a part, else the root's)

    def set_qpos(self, values: dict[str, float]) -> None:
        qpos = np.zeros(len(self.joint_index), dtype=np.float32)
        for name, value in values.items():
            qpos[self.joint_index[name]] = value
        self.articulation.set_qpos(qpos)
        self.articulation.set_qvel(np.zeros_like(qpos))

    def qpos(self) -> np.ndarray:
        return np.asarray(self.articulation.get_qpos(), dtype=np.float64)

    def link_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """World rotation and translation of a link."""
        pose = self.link_components[name].entity_pose
        return quat_to_matrix(tuple(pose.q)), np.asarray(pose.p, dtype=np.float64)

    def bounds(self, part: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """World axis-aligned bounds of the collision shapes of the object (or of one part), as it stands."""
        boxes = [
            c.compute_global_aabb_tight()
            for name, c in self.link_components.items()
            if c.collision_shapes and (part is None or self.owner[name] == part)
        ]
        if not boxes:
            raise ValueError(
                f"{self.obj.category}: {'part ' + part if part else 'object'} has no collision shapes"
            )
        boxes = np.asarray(boxes, dtype=np.float64)
        return boxes[:, 0].min(0), boxes[:, 1].max(0)

    def label_at(self, link_name: str, world_point: np.ndarray) -> str:
        """Part label (``door``, ``handle``, …) of the shape of a part containing a world point."""
        link = self.obj.link(link_name)
        rot, trans = self.link_pose(link_name)
        frame_rot, frame_trans = link_frame(link)
        # object-frame point of the child at joint position 0
        local = frame_rot @ (rot.T @ (np.asarray(world_point, float) - trans)) + frame_trans
        best = link.label
        for shape in link.shapes:
            if shape_contains(shape, local, tol=2e-3):
                best = shape.label
                if shape.label == "handle":
                    return best
        return best


def _new_scene(render: bool, timestep: float):
    sapien = import_sapien()
    systems = [sapien.physx.PhysxCpuSystem()]
    if render:
        systems.append(sapien.render.RenderSystem())
    scene = sapien.Scene(systems)
    scene.timestep = timestep
    if render:
        scene.set_ambient_light([0.45, 0.45, 0.45])
        scene.add_directional_light([0.5, 0.3, -1.0], [0.8, 0.8, 0.8])
        scene.add_directional_light([-0.3, -0.6, -0.5], [0.3, 0.3, 0.3])
    return sapien, scene


def _finish(scene, obj: ArticulatedObject, articulation, gravity: bool = False) -> BuiltScene:
    components = {c.name: c for c in articulation.get_links()}
    for c in components.values():
        c.disable_gravity = not gravity
    joint_index = {joint.child_link.name: i for i, joint in enumerate(articulation.get_active_joints())}
    owner: dict[str, str] = {}
    for c in articulation.get_links():  # parents come before their children
        owner[c.name] = c.name if c.name in joint_index or c.parent is None else owner[c.parent.name]
    return BuiltScene(scene, obj, articulation, components, joint_index, owner)


def build_scene(
    obj: ArticulatedObject, *, render: bool = False, timestep: float = TIMESTEP, via_urdf: bool = False
) -> BuiltScene:
    """Create the scene and the articulation (root fixed at the origin), directly from the object's
    primitives or, with ``via_urdf``, through its emitted URDF and SAPIEN's URDF loader."""
    sapien, scene = _new_scene(render, timestep)
    if via_urdf:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "object.urdf"
            path.write_text(to_urdf(obj))
            articulation = load_articulation(scene, path, render=render, density=DENSITY)
    else:
        articulation = _build_articulation(sapien, scene, obj, render)
    return _finish(scene, obj, articulation)


def build_urdf_scene(
    urdf_path: str | Path,
    *,
    render: bool = False,
    timestep: float = TIMESTEP,
    protocol: Protocol = SIMPLE,
    scale: float = 1.0,
    collision: str = "convex",
) -> BuiltScene:
    """Load a URDF object scaled by ``scale`` (root fixed where the file puts it) with the physics of
    ``protocol``, and describe its parts from the kinematics; ``collision`` as in ``urdf.COLLISION_MODES``."""
    sapien, scene = _new_scene(render, timestep)
    articulation = load_articulation(
        scene, urdf_path, render=render, scale=scale, material=protocol.material, collision=collision
    )
    if protocol.joint_damping is not None:
        for joint in articulation.get_active_joints():
            joint.set_drive_property(0.0, protocol.joint_damping)
            joint.set_friction(0.0)
    if protocol.solver_iterations is not None:
        articulation.set_solver_position_iterations(protocol.solver_iterations)
    labels = link_labels(urdf_path)
    root = articulation.get_links()[0]
    # link poses with every joint at 0 (live poses are valid only after a step): parent * joint * child^-1
    at_zero = {root.name: articulation.get_root_pose()}
    for c in articulation.get_links()[1:]:
        at_zero[c.name] = at_zero[c.parent.name] * c.joint.pose_in_parent * c.joint.pose_in_child.inv()
    links = [Link(root.name, "body", ())]
    for joint in articulation.get_active_joints():
        pose = at_zero[joint.parent_link.name] * joint.pose_in_parent
        lo, hi = (float(v) for v in np.asarray(joint.limits, dtype=np.float64)[0])
        kind = "prismatic" if joint.type == "prismatic" else "revolute"
        axis = tuple(float(v) for v in quat_to_matrix(tuple(pose.q))[:, 0])
        links.append(
            Link(
                joint.child_link.name,
                labels.get(joint.child_link.name, joint.child_link.name),
                (),
                Joint(
                    kind,
                    tuple(float(v) for v in pose.p),
                    axis,
                    (lo, hi),
                    float(joint.friction),
                    float(joint.damping),
                ),
            )
        )
    obj = ArticulatedObject(f"urdf:{Path(urdf_path).parent.name or Path(urdf_path).stem}", 0, tuple(links))
    return _finish(scene, obj, articulation, gravity=protocol.gravity)


def _build_articulation(sapien, scene, obj: ArticulatedObject, render: bool):
    builder = scene.create_articulation_builder()
    link_builders = {}
    for link in obj.links:
        parent = None if link.joint is None else link_builders[obj.links[0].name]
        lb = builder.create_link_builder(parent)
        lb.set_name(link.name)
        frame = sapien.Pose(link.joint.origin, quat_x_to(link.joint.axis)) if link.joint else sapien.Pose()
        if link.joint is not None:
            j = link.joint
            lb.set_joint_name(f"joint_{link.name}")
            lb.set_joint_properties(
                j.type, [list(j.limits)], pose_in_parent=frame, pose_in_child=sapien.Pose(), damping=j.damping
            )
        inverse = frame.inv()
        for s in link.shapes:
            pose = inverse * sapien.Pose(s.pos, s.quat)
            if s.kind == "box":
                lb.add_box_collision(pose, half_size=s.size, density=DENSITY)
            else:
                lb.add_cylinder_collision(pose, radius=s.size[0], half_length=s.size[1], density=DENSITY)
            if render:
                material = sapien.render.RenderMaterial(base_color=[*s.colour, 1.0], roughness=0.6)
                if s.kind == "box":
                    lb.add_box_visual(pose, half_size=s.size, material=material)
                else:
                    lb.add_cylinder_visual(pose, radius=s.size[0], half_length=s.size[1], material=material)
        link_builders[link.name] = lb
    articulation = builder.build(fix_root_link=True)
    for joint in articulation.get_active_joints():  # the builder's friction argument is ignored by PhysX
        joint.set_friction(obj.link(joint.child_link.name).joint.friction)
    return articulation
