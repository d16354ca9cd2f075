"""Named cameras of one episode (``make-data --source sapien --views front,wrist``): several images per record.

``front`` is the episode's own camera (``EpisodeSpec.camera``): the one the ground truth, the answers and the
executed contact pixel are in, so it is always the first view. ``wrist`` is a closer, wider view from the side
a gripper would come from: 0.45 of the front camera's distance to what it looks at, turned 25 degrees in
azimuth and 10 up, 55 degree field of view, 224 x 224 pixels (another size, as a second camera has). It is
fixed by the front camera alone, so it never encodes the answer (it does not look at the contact point) and a
record can be rendered again from its ``meta``.
"""

from __future__ import annotations

import math

import numpy as np

from vlm_grpoma.envs.sapien.camera import CameraSpec

VIEWS = ("front", "wrist")
WRIST_DISTANCE = 0.45
WRIST_TURN_DEG, WRIST_RISE_DEG = 25.0, 10.0
WRIST_FOVY_DEG = 55.0
WRIST_SIZE = 224


def parse_views(text: str) -> tuple[str, ...]:
    """``"front,wrist"`` as view names; the first must be ``front`` (the ground truth's view), none twice."""
    views = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise ValueError(f"unknown view {unknown[0]!r}; choose from {', '.join(VIEWS)}")
    if not views or views[0] != "front":
        raise ValueError("the first view must be front: the ground truth and the answers are in it")
    if len(set(views)) != len(views):
        raise ValueError(f"a view is named twice in {text!r}")
    return views


def view_camera(name: str, front: CameraSpec) -> CameraSpec:
    """The camera of view ``name`` for an episode whose own camera is ``front``."""
    if name == "front":
        return front
    target = np.asarray(front.target, dtype=np.float64)
    offset = np.asarray(front.position, dtype=np.float64) - target
    distance = float(np.linalg.norm(offset)) * WRIST_DISTANCE
    azimuth = math.atan2(offset[1], offset[0]) + math.radians(WRIST_TURN_DEG)
    elevation = math.asin(offset[2] / np.linalg.norm(offset)) + math.radians(WRIST_RISE_DEG)
    direction = np.array(
        [
            math.cos(elevation) * math.cos(azimuth),
            math.cos(elevation) * math.sin(azimuth),
            math.sin(elevation),
        ]
    )
    position = target + distance * direction
    return CameraSpec(
        tuple(float(v) for v in position),
        tuple(float(v) for v in target),
        WRIST_SIZE,
        WRIST_SIZE,
        WRIST_FOVY_DEG,
    )
