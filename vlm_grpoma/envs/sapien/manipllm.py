"""Episodes under the ``manipllm`` protocol, sampled the way ManipLLM collects its data
(``data_collection/code/collect_data.py``, ``env.py``, ``camera.py``).

An attempt draws the object scale (uniform 0.7..1.2) and state (with probability 0.8 every part closed at its
lower limit, else each part closed or, with probability 0.5, uniform in its range), lets the object come to
rest under gravity (dropped when it does not), draws ManipLLM's camera, then a contact pixel uniformly among
the movable parts' pixels whose affordance exceeds 0.6 (every pixel of a prismatic part; for a revolute part
the distance from its hinge axis, normalised to [0, 1] over the part's visible pixels). The demonstration
pushes into the surface there (``up`` = reversed surface normal plus ManipLLM's noise, mean -0.01 and sd 0.01
per component; ``forward`` random and orthogonal) and pulls; ManipLLM keeps a sample only when that succeeds
under its collection rule (|dq| > 0.1 or half the range, cosine > 0.5), and so do we. The demonstration is
the episode's ground truth: ``oracle`` in evaluation, the answer in training records.

Pixel order: ManipLLM's contact pixel "(x, y)" is (row, column) — ``xs, ys = np.where(aff > 0.6)``, then
``gt_nor[x, y]`` and PIL's ``draw.ellipse((y - r, x - r, ...))`` in ``collect_data.py``, and the test script
indexes ``cam_XYZA[x, y]`` with the parsed answer — as integer indices. Ours is (x, y) = (column, row) at the
pixel centre (``point_2d``, as every answer of this suite): ManipLLM's "(r, c)" is our (c + 0.5, r + 0.5).
Nothing here reads ManipLLM's pixels (episodes and answers are ours), so no transpose is applied anywhere;
data converted from ManipLLM must swap the two.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vlm_grpoma.answers import ContactAction
from vlm_grpoma.envs.sapien.camera import (
    CameraSpec,
    part_names,
    raycast,
    raycast_image,
    sample_manipllm_camera,
)
from vlm_grpoma.envs.sapien.partnet import PartNetAsset, read_asset
from vlm_grpoma.envs.sapien.protocol import MANIPLLM
from vlm_grpoma.envs.sapien.scene import BuiltScene
from vlm_grpoma.envs.sapien.success import COLLECTION_RULE
from vlm_grpoma.envs.sapien.task import LIMIT_CLAMP, EpisodeSpec, execute, prepare, sample_episode

SCALE = (0.7, 1.2)
CLOSED_PROBABILITY = 0.8
#: ManipLLM waits for 5000 still steps at 1/500 s (10 s, at most 40 s); we ask for 1 s still, at most 20 s
STILL_STEPS, MAX_SETTLE_STEPS = 240, 4800
STILL_DQ = 1e-6  # joint change per step below which a part counts as still (ManipLLM's)
STILL_CONTACT_FORCE = 5.0  # newtons: ManipLLM's impulse threshold 1e-2 N s at its 1/500 s step
AFFORDANCE_THRESHOLD = 0.6
AFFORDANCE_STRIDE = 3  # search every 3rd pixel row and column (raycasts are ~4 us each)
NOISE_MEAN, NOISE_SD = -0.01, 0.01
ATTEMPTS = 25


def initial_state(rng: np.random.Generator, built: BuiltScene) -> dict[str, float]:
    """ManipLLM's pulling state: 'closed' with probability 0.8, else 'random-closed-middle'."""
    closed = rng.random() < CLOSED_PROBABILITY
    state = {}
    for link in built.obj.movable:
        lo, hi = (min(max(float(v), -LIMIT_CLAMP), LIMIT_CLAMP) for v in link.joint.limits)
        state[link.name] = lo if closed or rng.random() >= 0.5 else float(lo + rng.random() * (hi - lo))
    return state


def settle(built: BuiltScene) -> bool:
    """Step until the object has been still (joints and contacts) for STILL_STEPS; False if it never is."""
    still, previous = 0, built.qpos()
    limit = (STILL_CONTACT_FORCE * built.scene.timestep) ** 2
    for _ in range(MAX_SETTLE_STEPS):
        built.scene.step()
        qpos = built.qpos()
        pushing = any(
            float(point.impulse @ point.impulse) > limit
            for contact in built.scene.physx_system.get_contacts()
            for point in contact.points
        )
        still = still + 1 if np.max(np.abs(qpos - previous), initial=0.0) < STILL_DQ and not pushing else 0
        previous = qpos
        if still >= STILL_STEPS:
            return True
    return False


def affordance_pixels(built: BuiltScene, camera: CameraSpec, stride: int = AFFORDANCE_STRIDE) -> list:
    """Pixel centres (x, y) on movable parts whose affordance exceeds AFFORDANCE_THRESHOLD."""
    depth, index = raycast_image(built, camera, stride, only_object=True)
    names = part_names(built)
    ys, xs = np.mgrid[0 : camera.height : stride, 0 : camera.width : stride]
    pixels = np.stack([xs + 0.5, ys + 0.5], axis=-1)
    joints = built.articulation.get_active_joints()
    chosen = []
    for name, number in built.joint_index.items():
        mask = index == names.index(name)
        if not mask.any():
            continue
        if joints[number].type == "prismatic":
            chosen += list(pixels[mask])
            continue
        pose = joints[number].parent_link.entity_pose * joints[number].pose_in_parent
        axis = np.asarray(pose.to_transformation_matrix())[:3, 0]
        points = np.array(camera.position) + camera.pixel_rays(pixels[mask]) * depth[mask][:, None]
        offset = points - np.asarray(pose.p, dtype=np.float64)
        lever = np.linalg.norm(offset - (offset @ axis)[:, None] * axis, axis=1)
        span = lever.max() - lever.min()
        if span > 0:
            chosen += list(pixels[mask][(lever - lever.min()) / span > AFFORDANCE_THRESHOLD])
    return chosen


def demonstration(rng: np.random.Generator, camera: CameraSpec, pixel, normal: np.ndarray) -> ContactAction:
    """ManipLLM's demonstration at a pixel: up = noisy reversed normal, forward random and orthogonal."""
    up = -np.asarray(normal, dtype=np.float64)
    up = up / np.linalg.norm(up) + rng.normal(NOISE_MEAN, NOISE_SD, 3)
    up /= np.linalg.norm(up)
    forward = rng.normal(size=3)
    forward -= (forward @ up) * up
    forward /= np.linalg.norm(forward)
    return ContactAction(
        (float(pixel[0]), float(pixel[1])),
        tuple(float(v) for v in camera.to_camera(up)),
        tuple(float(v) for v in camera.to_camera(forward)),
    )


def sample_asset_episode(
    asset: PartNetAsset | str, episode_seed: int, *, width: int = 336, height: int = 336
) -> tuple[EpisodeSpec, ContactAction]:
    """An episode on a PartNet-Mobility object (a folder or a read asset) and its successful demonstration;
    raises RuntimeError when ATTEMPTS attempts give none (ManipLLM drops such objects too)."""
    asset = read_asset(asset) if not isinstance(asset, PartNetAsset) else asset
    rng = np.random.default_rng([episode_seed, int.from_bytes(asset.asset_id.encode()[-8:], "little"), 11])
    base = EpisodeSpec(
        asset.category,
        0,
        CameraSpec((0, 0, 0), (1, 0, 0)),
        "",
        "",
        "pull",
        {},
        episode_seed,
        str(asset.urdf),
        MANIPLLM.name,
    )
    for _ in range(ATTEMPTS):
        spec = replace(base, scale=float(rng.uniform(*SCALE)))
        built = prepare(spec)
        if not built.obj.movable:
            raise RuntimeError(f"{asset.urdf}: no link has a revolute, continuous or prismatic joint")
        built.set_qpos(initial_state(rng, built))
        if not settle(built):
            continue
        qpos = built.qpos()
        spec = replace(spec, initial_qpos={name: float(qpos[i]) for name, i in built.joint_index.items()})
        camera = sample_manipllm_camera(rng, width, height)
        candidates = affordance_pixels(built, camera)
        if not candidates:
            continue
        pixel = candidates[int(rng.integers(len(candidates)))]
        hit = raycast(built, camera, *pixel)
        if hit is None or hit.link not in built.joint_index:
            continue
        action = demonstration(rng, camera, pixel, hit.normal)
        spec = replace(spec, camera=camera, target_link=hit.link, target_label=built.obj.link(hit.link).label)
        outcome = execute(spec, action)
        if not outcome.failure and COLLECTION_RULE.judge(
            outcome.delta_q, outcome.joint_range, outcome.direction_cos, "pull"
        ):
            return spec, action
    raise RuntimeError(
        f"{asset.urdf}: no successful demonstration in {ATTEMPTS} attempts (episode {episode_seed})"
    )


def sample_asset(
    asset: PartNetAsset | str, episode_seed: int, protocol: str
) -> tuple[EpisodeSpec, ContactAction]:
    """An episode on a PartNet-Mobility object under ``protocol``: ManipLLM's sampling and demonstration, or
    the simple protocol's (``task.sample_episode``: camera around the object, oracle at the far edge)."""
    asset = read_asset(asset) if not isinstance(asset, PartNetAsset) else asset
    if protocol == MANIPLLM.name:
        return sample_asset_episode(asset, episode_seed)
    return sample_episode(asset.category, 0, episode_seed, urdf=str(asset.urdf))
