"""A floating suction gripper (NOTES-STACK.md recipe).

The gripper is a 1 kg dynamic body without gravity or collision shapes, pulled towards a moving world target
by a force-limited drive (the "arm"). Suction is a second stiff, position-only drive between the gripper and
the grasped link, anchored at the contact point, so a door can swing while it is held. PhysX drive force
limits are impulses per step, hence ``newtons * timestep``.
"""

from __future__ import annotations

import numpy as np

from vlm_grpoma.envs.sapien.objects import quat_x_to
from vlm_grpoma.envs.sapien.scene import BuiltScene
from vlm_grpoma.envs.sapien.vulkan import import_sapien

ARM_STIFFNESS, ARM_DAMPING = 4000.0, 150.0
SUCTION_STIFFNESS, SUCTION_DAMPING = 20000.0, 300.0


class SuctionGripper:
    def __init__(self, built: BuiltScene, position: np.ndarray, approach: np.ndarray, max_force: float):
        sapien = import_sapien()
        self._sapien = sapien
        self.built = built
        self.rotation = quat_x_to(tuple(approach))  # gripper x axis along the approach direction
        timestep = built.scene.timestep
        body = sapien.physx.PhysxRigidDynamicComponent()
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
