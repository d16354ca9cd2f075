"""A floating suction gripper: one driven rigid body in place of a robot arm.

The gripper is a 1 kg dynamic body without gravity, pulled towards a moving world target by a force-limited
drive (the "arm"). Its frame has x along the approach direction (``up``, into the surface) and y along
``up x forward`` (ManipLLM's ``left``). Without ``collision`` it has no shapes; with it, it carries boxes for
the Panda hand and its closed fingers as ManipLLM loads them (scale 1.2): the hand 0..0.079 along x and
0.24 wide along y, the fingertips reaching 0.134. Suction is a second stiff, position-only drive between the
gripper and the grasped link, anchored at the contact point, so a door can swing while it is held. PhysX
drive force limits are impulses per step, hence ``newtons * timestep``.
"""

from __future__ import annotations

import numpy as np

from vlm_grpoma.envs.sapien.objects import matrix_to_quat, quat_x_to
from vlm_grpoma.envs.sapien.scene import BuiltScene
from vlm_grpoma.envs.sapien.vulkan import import_sapien

ARM_STIFFNESS, ARM_DAMPING = 4000.0, 150.0
SUCTION_STIFFNESS, SUCTION_DAMPING = 20000.0, 300.0
#: (centre along x, half sizes) of the Panda hand and of its two closed fingers, ManipLLM's scale 1.2
HAND_BOX = (0.0395, (0.0395, 0.12, 0.036))
FINGERS_BOX = (0.102, (0.0325, 0.024, 0.012))
FINGERTIP_REACH = FINGERS_BOX[0] + FINGERS_BOX[1][0]


def _frame(approach: np.ndarray, forward: np.ndarray | None) -> tuple[float, float, float, float]:
    """Quaternion of a frame with x along ``approach`` and y along ``approach x forward`` (any roll when
    ``forward`` is None or parallel to the approach)."""
    x = np.asarray(approach, dtype=np.float64)
    y = np.cross(x, forward) if forward is not None else np.zeros(3)
    if np.linalg.norm(y) < 1e-6:
        return quat_x_to(tuple(x))
    y = y / np.linalg.norm(y)
    z = np.cross(x, y)
    return matrix_to_quat(np.stack([x, y, z], axis=1))


class SuctionGripper:
    def __init__(
        self,
        built: BuiltScene,
        position: np.ndarray,
        approach: np.ndarray,
        max_force: float,
        *,
        forward: np.ndarray | None = None,
        collision: bool = False,
        material: tuple[float, float, float] | None = None,
    ):
        sapien = import_sapien()
        self._sapien = sapien
        self.built = built
        self.rotation = _frame(approach, forward)
        timestep = built.scene.timestep
        body = sapien.physx.PhysxRigidDynamicComponent()
        if collision:
            physx_material = sapien.physx.PhysxMaterial(*material) if material else None
            for centre, half in (HAND_BOX, FINGERS_BOX):
                shape = sapien.physx.PhysxCollisionShapeBox(half_size=list(half), material=physx_material)
                shape.local_pose = sapien.Pose([centre, 0.0, 0.0])
                body.attach(shape)
        body.mass = 1.0
        body.inertia = [1e-3, 1e-3, 1e-3]
        body.cmass_local_pose = sapien.Pose()
        body.disable_gravity = True
        self.entity = sapien.Entity()
        self.entity.name = "gripper"
        self.entity.add_component(body)
        self.entity.set_pose(sapien.Pose(position, self.rotation))
        built.scene.add_entity(self.entity)
        self.body = body
        self.arm = built.scene.create_drive(None, sapien.Pose(), self.entity, sapien.Pose())
        impulse = max_force * timestep
        for set_axis in (
            self.arm.set_drive_property_x,
            self.arm.set_drive_property_y,
            self.arm.set_drive_property_z,
        ):
            set_axis(ARM_STIFFNESS, ARM_DAMPING, impulse)
        self.arm.set_drive_property_slerp(ARM_STIFFNESS, ARM_DAMPING, impulse)
        self.move_to(position)
        self.suction = None
        self._suction_impulse = 2 * impulse

    def move_to(self, position: np.ndarray) -> None:
        self.arm.set_drive_target(self._sapien.Pose(position, self.rotation))

    def attach(self, link: str, world_point: np.ndarray) -> np.ndarray:
        """Suction onto ``link`` at a world point; returns that point in the link's frame."""
        sapien = self._sapien
        component = self.built.link_components[link]
        rot, trans = self.built.link_pose(link)
        local = rot.T @ (np.asarray(world_point, float) - trans)
        gripper_pose = self.entity.pose
        in_gripper = gripper_pose.inv() * sapien.Pose(world_point)
        self.suction = self.built.scene.create_drive(
            self.entity, sapien.Pose(in_gripper.p), component, sapien.Pose(local)
        )
        for set_axis in (
            self.suction.set_drive_property_x,
            self.suction.set_drive_property_y,
            self.suction.set_drive_property_z,
        ):
            set_axis(SUCTION_STIFFNESS, SUCTION_DAMPING, self._suction_impulse)
        self.suction.set_drive_target(sapien.Pose())
        return local

    def position(self) -> np.ndarray:
        return np.asarray(self.entity.pose.p, dtype=np.float64)
