"""Manipulation episodes: sampling (object, camera, target, oracle action) and executing a ContactAction.

Execution (as ManipLLM's test code): back-project the contact pixel (physics raycast through the pinhole
camera, so no renderer is needed); the part under it is the part acted on (a pixel on the fixed body fails
``non_movable``); flip ``up`` so it opposes the surface normal (it is the approach direction, into the
surface); place the suction gripper as the episode's protocol says (``protocol``: ``simple`` at the contact,
``manipllm`` 0.15 back along ``up`` then approaching to 0.10 with the hand's collision boxes), attach it to
the part at the contact point, then ``pull`` it back along -up to the protocol's pull distance (or ``push``
along +up). ``forward`` sets the gripper's roll: felt only through the hand's collision boxes (``manipllm``);
it must still be a valid direction.

Every episode builds a fresh scene (~1 ms of a ~5 ms episode, measured), so results never depend on what
ran before in a process; resetting a shared scene per answer would save at most that 1 ms and PhysX keeps
solver state that a reset does not clear. Success (``success.SuccessRule``, ManipLLM's test rule): the joint
of the part moved |dq| > 0.03 or > 50 % of its range and, for pulling, the contact point moved along the pull
direction (cosine > 0.3); both are measured from before the approach. Any movable part counts (as in
ManipLLM, whose prompt names no part); the spec's ``target_link`` is where the oracle acts and what the
grounding tasks label.

Record ``meta`` for manipulation (JSON-serialisable, written by ``EpisodeSpec.to_meta``)::

    {"object": {"category": "microwave", "seed": 1000123},
     "camera": {"position": [x, y, z], "target": [x, y, z], "width": 336, "height": 336, "fovy_deg": 35.0},
     "target_link": "door_0", "target_label": "door", "primitive": "pull",
     "initial_qpos": {"door_0": 0.0}, "episode_seed": 17, "protocol": "simple"}

``object`` may also carry ``"urdf": "/abs/path/mobility.urdf"`` (and ``"scale"``): the episode then loads
that file (e.g. a PartNet-Mobility object) instead of the procedural (category, seed) object; its parts are
the links with revolute/continuous/prismatic joints. Records without ``protocol`` are ``simple``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from vlm_grpoma.answers import ContactAction
from vlm_grpoma.envs.sapien.camera import CameraSpec, Hit, Views, raycast, render, sample_camera
from vlm_grpoma.envs.sapien.gripper import SuctionGripper
from vlm_grpoma.envs.sapien.objects import (
    Link,
    instance_seed,
    joint_transform,
    make_object,
    shape_corners,
    split_categories,
)
from vlm_grpoma.envs.sapien.protocol import Protocol, get_protocol
from vlm_grpoma.envs.sapien.scene import BuiltScene, build_scene, build_urdf_scene
from vlm_grpoma.envs.sapien.success import direction_cosine

Primitive = Literal["pull", "push"]
#: ManipLLM replaces infinite joint limits by +-10 (utils.process_angle_limit)
LIMIT_CLAMP = 10.0


@dataclass(frozen=True)
class EpisodeSpec:
    category: str
    seed: int
    camera: CameraSpec
    target_link: str
    target_label: str
    primitive: Primitive = "pull"
    initial_qpos: dict[str, float] = field(default_factory=dict)
    episode_seed: int = 0
    urdf: str = ""  # a URDF file to load instead of the procedural (category, seed) object
    protocol: str = "simple"
    scale: float = 1.0  # of the URDF object

    def to_meta(self) -> dict:
        obj = {"category": self.category, "seed": self.seed}
        if self.urdf:
            obj |= {"urdf": self.urdf, "scale": self.scale}
        return {
            "object": obj,
            "camera": self.camera.to_json(),
            "target_link": self.target_link,
            "target_label": self.target_label,
            "primitive": self.primitive,
            "initial_qpos": dict(self.initial_qpos),
            "episode_seed": self.episode_seed,
            "protocol": self.protocol,
        }

    @classmethod
    def from_meta(cls, meta: dict) -> EpisodeSpec:
        try:
            spec = cls(
                meta["object"]["category"],
                int(meta["object"]["seed"]),
                CameraSpec.from_json(meta["camera"]),
                meta["target_link"],
                meta["target_label"],
                meta.get("primitive", "pull"),
                {k: float(v) for k, v in meta.get("initial_qpos", {}).items()},
                int(meta.get("episode_seed", 0)),
                str(meta["object"].get("urdf", "")),
                str(meta.get("protocol", "simple")),
                float(meta["object"].get("scale", 1.0)),
            )
            get_protocol(spec.protocol)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"manipulation meta is missing or has a bad field ({err!r}): {meta!r}") from err
        return spec


@dataclass(frozen=True)
class ExecConfig:
    pull_distance: float | None = None  # the protocol's when None
    move_steps: int | None = None  # the protocol's when None
    max_steps: int = 400  # per-episode step limit (approach, move and settle are cut to it)
    timeout_s: float = 10.0  # wall-clock limit per episode
    max_force: float | None = None  # newtons the arm may apply; the protocol's when None


DEFAULT_EXEC = ExecConfig()


@dataclass(frozen=True)
class Outcome:
    """Result of one episode. ``failure`` is "" when the action was executed (successfully or not), else a
    short reason: invalid_action, off_image, off_object, non_movable, timeout, blowup, sim_error, worker_crash."""

    success: bool
    failure: str = ""
    link: str = ""
    delta_q: float = 0.0
    progress: float = 0.0  # |dq| / joint range, clipped to [0, 1]
    direction_cos: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    detail: str = ""
    joint_range: float = 0.0

    @classmethod
    def failed(cls, reason: str, **fields) -> Outcome:
        return cls(False, reason, **fields)


def prepare(spec: EpisodeSpec, *, render: bool = False) -> BuiltScene:
    """Build the episode's scene with the initial joint state applied (link poses are valid after a step)."""
    protocol = get_protocol(spec.protocol)
    if spec.urdf:
        built = build_urdf_scene(spec.urdf, render=render, protocol=protocol, scale=spec.scale)
    elif protocol.name != "simple":
        raise ValueError(
            f"protocol {protocol.name} runs on URDF (PartNet-Mobility) objects, not procedural ones"
        )
    else:
        built = build_scene(make_object(spec.category, spec.seed), render=render)
    built.set_qpos(spec.initial_qpos)
    built.scene.step()
    return built


def render_episode(spec: EpisodeSpec) -> tuple[BuiltScene, Views]:
    """The episode's scene built for rendering, and its image from the episode's camera."""
    built = prepare(spec, render=True)
    return built, render_view(built, spec, spec.camera)


def render_view(built: BuiltScene, spec: EpisodeSpec, camera: CameraSpec) -> Views:
    """The episode's scene seen from ``camera``, on its protocol's background."""
    return render(built, camera, get_protocol(spec.protocol).background)


def _unit(v) -> np.ndarray | None:
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (3,) or not np.all(np.isfinite(a)):
        return None
    n = float(np.linalg.norm(a))
    return a / n if n > 1e-6 else None


def joint_range(link: Link) -> float:
    """A part's joint range, with infinite limits clamped to +-10 as ManipLLM does."""
    lo, hi = (min(max(float(v), -LIMIT_CLAMP), LIMIT_CLAMP) for v in link.joint.limits)
    return hi - lo


def execute(spec: EpisodeSpec, action: ContactAction, config: ExecConfig = DEFAULT_EXEC) -> Outcome:
    """Run one episode in a freshly built scene; never raises for a bad action or an unstable simulation."""
    start = time.perf_counter()
    try:
        x, y = (float(v) for v in action.point)
        up_cam, forward = _unit(action.up), _unit(action.forward)
    except (TypeError, ValueError):
        return Outcome.failed("invalid_action")
    if not (math.isfinite(x) and math.isfinite(y)) or up_cam is None or forward is None:
        return Outcome.failed("invalid_action")
    cam = spec.camera
    if not (0 <= x < cam.width and 0 <= y < cam.height):
        return Outcome.failed("off_image")
    built = prepare(spec)
    hit = raycast(built, cam, x, y)
    if hit is None:
        return Outcome.failed("off_object")
    link = built.obj.link(hit.link)
    if link.joint is None:
        return Outcome.failed("non_movable", link=hit.link)
    approach = cam.to_world(up_cam)
    if approach @ hit.normal > 0:
        approach = -approach
    protocol = get_protocol(spec.protocol)
    return _run(built, link, hit, approach, cam.to_world(forward), spec.primitive, protocol, config, start)


def _run(
    built: BuiltScene,
    link: Link,
    hit: Hit,
    approach: np.ndarray,
    forward: np.ndarray,
    primitive: Primitive,
    protocol: Protocol,
    config: ExecConfig,
    start: float,
) -> Outcome:
    index = built.joint_index[link.name]
    rot, trans = built.link_pose(link.name)
    local = rot.T @ (hit.point - trans)  # the contact on the part, and the joint, before anything moves
    q0 = float(built.qpos()[index])
    start_d, contact_d = protocol.approach or (0.0, 0.0)
    gripper = SuctionGripper(
        built,
        hit.point - approach * start_d,
        approach,
        config.max_force if config.max_force is not None else protocol.max_force,
        forward=forward if protocol.gripper_collision else None,  # a bare suction point has no roll
        collision=protocol.gripper_collision,
        material=protocol.material,
    )
    direction = -approach if primitive == "pull" else approach
    pull = config.pull_distance if config.pull_distance is not None else protocol.pull_distance
    move_steps = config.move_steps if config.move_steps is not None else protocol.move_steps
    attached = hit.point - approach * contact_d
    goal = attached + direction * (pull - contact_d)
    phases = [
        (protocol.approach_steps, hit.point - approach * start_d, attached),
        (protocol.hold_steps, attached, attached),
        (move_steps, attached, goal),
        (protocol.settle_steps, goal, goal),
    ]
    steps = 0
    for phase, (count, begin, end) in enumerate(phases):
        if phase == 2:  # suction where the contact point is now (the approach may have pushed the part)
            rot, trans = built.link_pose(link.name)
            gripper.attach(link.name, rot @ local + trans if steps else hit.point)
        for i in range(1, count + 1):
            if steps >= config.max_steps:
                break
            gripper.move_to(begin + (end - begin) * (i / count))
            built.scene.step()
            steps += 1
            if time.perf_counter() - start > config.timeout_s:
                return Outcome.failed(
                    "timeout", link=link.name, steps=steps, seconds=time.perf_counter() - start
                )
    qpos = built.qpos()
    rot, trans = built.link_pose(link.name)
    end_point = rot @ local + trans
    if not (
        np.all(np.isfinite(qpos))
        and np.all(np.isfinite(end_point))
        and np.all(np.isfinite(gripper.position()))
        and np.linalg.norm(end_point - hit.point) < 10
    ):
        return Outcome.failed("blowup", link=link.name, steps=steps, seconds=time.perf_counter() - start)
    dq = float(qpos[index]) - q0
    span = joint_range(link)
    cosine = direction_cosine(hit.point, end_point, direction)
    success = protocol.rule.judge(dq, span, cosine, primitive)
    return Outcome(
        success,
        "",
        link.name,
        abs(dq),
        min(1.0, abs(dq) / max(span, 1e-9)),
        cosine,
        steps,
        time.perf_counter() - start,
        joint_range=span,
    )


# --------------------------------------------------------------------------------------------- sampling


def _lever(link: Link, point: np.ndarray) -> float:
    """Distance of a world point from a revolute part's axis (0 for a prismatic part)."""
    if link.joint.type == "prismatic":
        return 0.0
    axis, r = np.array(link.joint.axis), np.asarray(point, float) - np.array(link.joint.origin)
    return float(np.linalg.norm(r - (r @ axis) * axis))


def _shape_candidates(built: BuiltScene, link: Link) -> list[np.ndarray]:
    """World contact candidates on a procedural part as it stands: handle centres first, then a grid over
    its largest panel, farthest from a revolute axis first."""
    rot, trans = joint_transform(link.joint, float(built.qpos()[built.joint_index[link.name]]))
    handles = [rot @ np.array(s.pos) + trans for s in link.shapes if s.label == "handle"]
    panel = max((s for s in link.shapes if s.label != "handle"), key=lambda s: np.prod(s.size[:2]))
    corners = shape_corners(panel)
    lo, hi = corners.min(0), corners.max(0)
    grid = [
        rot @ (lo + (hi - lo) * np.array([a, b, c])) + trans
        for a in (0.1, 0.5, 0.9)
        for b in (0.1, 0.5, 0.9)
        for c in (0.0, 0.5, 1.0)
    ]
    grid.sort(key=lambda p: -_lever(link, p))
    return handles + grid


def opening_direction(link: Link, point: np.ndarray) -> np.ndarray:
    """Unit world direction in which a point on ``link`` moves as the part opens (root fixed at the origin)."""
    axis = np.array(link.joint.axis)
    if link.joint.type == "prismatic":
        return axis
    v = np.cross(axis, np.asarray(point, float) - np.array(link.joint.origin))
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-9 else v


PIXEL_OFFSETS = [(0, 0)] + [
    (dx, dy) for r in (1, 2, 3) for dx in (-r, 0, r) for dy in (-r, 0, r) if (dx, dy) != (0, 0)
]
SEARCH_GRID = 24  # rays per side when searching a part's image box (URDF parts have no handle labels)


def _contact(built: BuiltScene, camera: CameraSpec, link: Link, pixel: np.ndarray) -> Hit | None:
    """The hit under a pixel if it is on ``link``, faces the camera and faces the opening direction."""
    if not (1 <= pixel[0] < camera.width - 1 and 1 <= pixel[1] < camera.height - 1):
        return None
    hit = raycast(built, camera, float(pixel[0]), float(pixel[1]))
    if hit is None or hit.link != link.name or -(camera.pixel_ray(*pixel) @ hit.normal) < 0.2:
        return None
    return hit if opening_direction(link, hit.point) @ hit.normal >= 0.5 else None


def _oracle_pixels(built: BuiltScene, camera: CameraSpec, link: Link):
    """Pixels the oracle tries, best first: around projected shape candidates for procedural parts; for
    URDF parts, the valid hits of a grid over the part's image box, farthest from the hinge first."""
    if link.shapes:
        for point in _shape_candidates(built, link):
            centre = camera.project(point[None])[0]
            yield from (centre + offset for offset in PIXEL_OFFSETS)
        return
    lo, hi = built.bounds(link.name)
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    box = camera.project(corners)
    (x0, y0), (x1, y1) = box.min(0), box.max(0)
    grid = [
        np.array([x, y]) for x in np.linspace(x0, x1, SEARCH_GRID) for y in np.linspace(y0, y1, SEARCH_GRID)
    ]
    hits = [(pixel, hit) for pixel in grid if (hit := _contact(built, camera, link, pixel)) is not None]
    hits.sort(key=lambda ph: -_lever(link, ph[1].point))
    yield from (pixel for pixel, _ in hits)


def oracle_action(built: BuiltScene, camera: CameraSpec, target: str) -> ContactAction | None:
    """Contact on the target's handle (or its point farthest from the hinge) that the camera sees on a face
    turned towards the opening direction; up = against the opening direction (so the pull opens the part),
    forward = perpendicular to it. None when no candidate is visible."""
    link = built.obj.link(target)
    for pixel in _oracle_pixels(built, camera, link):
        hit = _contact(built, camera, link, pixel)
        if hit is None:
            continue
        up = -opening_direction(link, hit.point)
        forward = np.array([0.0, 0.0, 1.0]) - up[2] * up
        if np.linalg.norm(forward) < 1e-3:
            forward = np.cross(up, [0.0, 1.0, 0.0])
        up_c, fw_c = camera.to_camera(up), camera.to_camera(forward / np.linalg.norm(forward))
        return ContactAction(
            (float(pixel[0]), float(pixel[1])), tuple(float(v) for v in up_c), tuple(float(v) for v in fw_c)
        )
    return None


def sample_episode(
    category: str,
    seed: int,
    episode_seed: int,
    *,
    width: int = 336,
    height: int = 336,
    primitive: Primitive = "pull",
    tries: int = 30,
    urdf: str = "",
) -> tuple[EpisodeSpec, ContactAction]:
    """Object instance ``seed`` (or the ``urdf`` file); camera, target part and initial state from
    ``episode_seed``. Parts start closed (at their lower joint limit) for ``pull`` and 50-80 % open for
    ``push``. Resamples the camera until the oracle sees a contact."""
    rng = np.random.default_rng([episode_seed, seed, 7])
    base = EpisodeSpec(
        category,
        seed,
        CameraSpec((0, 0, 0), (1, 0, 0), width, height),
        "",
        "",
        primitive,
        {},
        episode_seed,
        urdf,
    )
    obj = prepare(base).obj
    targets = [link for link in obj.movable if np.all(np.isfinite(link.joint.limits))]
    if not targets:
        raise ValueError(f"{category}: no part has a finite joint range to open")
    target = targets[int(rng.integers(len(targets)))]
    qpos = {link.name: float(link.joint.limits[0]) if link in targets else 0.0 for link in obj.movable}
    if primitive == "push":
        lo, hi = target.joint.limits
        qpos[target.name] = float(lo + (hi - lo) * rng.uniform(0.5, 0.8))
    spec = replace(base, target_link=target.name, target_label=target.label, initial_qpos=qpos)
    built = prepare(spec)
    bounds = built.bounds()
    for _ in range(tries):
        camera = sample_camera(rng, bounds, width, height)
        action = oracle_action(built, camera, target.name)
        if action is not None:
            return replace(spec, camera=camera), action
    raise RuntimeError(f"no view of {category} seed {seed} shows part {target.name} (episode {episode_seed})")


def sample_split_episode(
    split: str,
    index: int,
    seed: int,
    *,
    width: int = 336,
    height: int = 336,
    primitive: Primitive = "pull",
    attempts: int = 5,
) -> tuple[EpisodeSpec, ContactAction]:
    """Episode ``index`` of a split: categories round-robin, instance seeds from the split's seed range
    (held-out instances for seen/unseen tests). Falls back to the next instance when no view works."""
    categories = split_categories(split)
    category = categories[index % len(categories)]
    for attempt in range(attempts):
        inst = instance_seed(split, index + attempt * 1_000_003, seed)
        try:
            return sample_episode(
                category, inst, seed * 1_000_003 + index, width=width, height=height, primitive=primitive
            )
        except RuntimeError:
            continue
    raise RuntimeError(
        f"could not sample episode {index} of split {split!r} ({category}) in {attempts} attempts"
    )
