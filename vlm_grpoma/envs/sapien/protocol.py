"""Execution protocols: how a ContactAction is carried out and judged.

``simple`` (procedural objects, the training default): parts ignore gravity (as if counterbalanced), the
collision-free suction gripper starts at the contact and pulls back 0.3 along ``up``. ``manipllm`` follows
ManipLLM's public test code (``test/test_one_stick_clean.py``, ``test/env_ori.py``): gravity on every part,
joints with damping 10 and no friction, friction 4 on object and gripper, 20 solver iterations, an arm of up
to 400 N (ManipLLM's gripper joints are driven at 1000 N/m with no force limit), a gripper
with the Panda hand's collision boxes (scaled 1.2 as ManipLLM loads it) that starts 0.15 back along ``up``,
approaches to 0.10 (its closed fingertips reach 0.134, so they press on the surface), attaches by suction
and pulls back to 0.5; images show the object on white. Both judge success with ManipLLM's test rule.
The action's pixel is (x, y) = (column, row); ManipLLM's answer "(x, y)" is (row, column) (see
:mod:`~vlm_grpoma.envs.sapien.manipllm`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlm_grpoma.envs.sapien.success import TEST_RULE, SuccessRule


@dataclass(frozen=True)
class Protocol:
    name: str
    gravity: bool  # object parts feel gravity
    # replaces every joint's damping (and zeroes its friction); None: the object's
    joint_damping: float | None
    # static, dynamic friction, restitution; None: SAPIEN's default
    material: tuple[float, float, float] | None
    solver_iterations: int | None
    # gripper start -> contact distance back along up; None: at the contact
    approach: tuple[float, float] | None
    pull_distance: float  # the gripper's final distance back along up from the contact
    gripper_collision: bool
    approach_steps: int
    hold_steps: int
    move_steps: int
    settle_steps: int
    max_force: float  # newtons the arm may apply
    background: tuple[int, int, int] | None = None  # RGB behind the object in rendered images
    rule: SuccessRule = TEST_RULE

    @property
    def contact_distance(self) -> float:
        return self.approach[1] if self.approach else 0.0


SIMPLE = Protocol(
    "simple",
    gravity=False,
    joint_damping=None,
    material=None,
    solver_iterations=None,
    approach=None,
    pull_distance=0.3,
    gripper_collision=False,
    approach_steps=0,
    hold_steps=0,
    move_steps=150,
    settle_steps=40,
    max_force=150.0,
)
MANIPLLM = Protocol(
    "manipllm",
    gravity=True,
    joint_damping=10.0,
    material=(4.0, 4.0, 0.01),
    solver_iterations=20,
    approach=(0.15, 0.10),
    pull_distance=0.5,
    gripper_collision=True,
    approach_steps=30,
    hold_steps=10,
    move_steps=180,
    settle_steps=40,
    max_force=400.0,  # ManipLLM's arm: joint drives of 1000 N/m over its 0.4 pull, no force limit
    background=(255, 255, 255),  # ManipLLM composites its renders on white
)
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (SIMPLE, MANIPLLM)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
