"""Procedural articulated objects built from boxes and cylinders, one seeded generator per category.

An object is pure data (no SAPIEN): a fixed root ``body`` link and movable child links, each with labelled
primitive shapes given in the OBJECT frame at joint position 0, and a joint (origin + unit axis in the object
frame, limits, friction, damping). Opening a part always INCREASES its joint position from 0. The object's
front faces -x (the camera looks at it from the -x side), z is up, and it stands on z = 0.
``make_object(category, seed)`` is deterministic, so records store only (category, seed).

Splits: ``SEEN_CATEGORIES`` train on instance seeds below ``HELD_OUT_SEED_START`` and are tested on seeds
from it (unseen instances); ``UNSEEN_CATEGORIES`` never appear in training. ``ASSET_ONLY_CATEGORIES`` are
generated only as PartNet-Mobility-format assets (``partnet_export``), where ManipLLM's split decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

Vec3 = tuple[float, float, float]
Quat = tuple[float, float, float, float]  # w, x, y, z (SAPIEN order)
IDENTITY: Quat = (1.0, 0.0, 0.0, 0.0)
HELD_OUT_SEED_START = 1_000_000
HANDLE_COLOURS: tuple[Vec3, ...] = ((0.15, 0.15, 0.17), (0.75, 0.75, 0.78), (0.55, 0.40, 0.20))


@dataclass(frozen=True)
class Shape:
    """A primitive: ``box`` with half sizes ``size``, or ``cylinder`` with ``size = (radius, half_length, 0)``
    whose axis is the local x axis (SAPIEN's convention)."""

    kind: Literal["box", "cylinder"]
    size: Vec3
    pos: Vec3
    quat: Quat
    colour: Vec3
    label: str


@dataclass(frozen=True)
class Joint:
    type: Literal["revolute", "prismatic"]
    origin: Vec3  # a point on the axis, object frame
    axis: Vec3  # unit; positive motion opens the part
    limits: tuple[float, float]
    friction: float
    damping: float


@dataclass(frozen=True)
class Link:
    name: str
    label: str
    shapes: tuple[Shape, ...]
    joint: Joint | None = None  # None only for the fixed root


@dataclass(frozen=True)
class ArticulatedObject:
    category: str
    seed: int
    links: tuple[Link, ...]  # links[0] is the fixed root; the others are its children

    @property
    def movable(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.joint is not None)

    def link(self, name: str) -> Link:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(f"{self.category} seed {self.seed} has no link {name!r}")

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Axis-aligned bounds of all shapes at joint position 0 (cylinders by their bounding box)."""
        corners = np.concatenate([shape_corners(s) for link in self.links for s in link.shapes])
        return corners.min(0), corners.max(0)


# ----------------------------------------------------------------------------------------------- geometry


def quat_to_matrix(q: Quat) -> np.ndarray:
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix_to_quat(m: np.ndarray) -> Quat:
    """The quaternion (w, x, y, z) of a rotation matrix."""
    w = math.sqrt(max(0.0, 1 + m[0, 0] + m[1, 1] + m[2, 2])) / 2
    x = math.copysign(math.sqrt(max(0.0, 1 + m[0, 0] - m[1, 1] - m[2, 2])) / 2, m[2, 1] - m[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1 - m[0, 0] + m[1, 1] - m[2, 2])) / 2, m[0, 2] - m[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1 - m[0, 0] - m[1, 1] + m[2, 2])) / 2, m[1, 0] - m[0, 1])
    return (w, x, y, z)


def quat_x_to(axis: Vec3) -> Quat:
    """The rotation taking the x axis to ``axis`` (a unit vector)."""
    a = np.asarray(axis, float)
    a = a / np.linalg.norm(a)
    c = float(a[0])
    if c < -1 + 1e-9:
        return (0.0, 0.0, 0.0, 1.0)  # pi about z
    k = np.cross([1.0, 0.0, 0.0], a)
    w = math.sqrt((1 + c) / 2)
    k = k / (2 * w)
    return (w, float(k[0]), float(k[1]), float(k[2]))


def shape_corners(s: Shape) -> np.ndarray:
    half = np.array(s.size) if s.kind == "box" else np.array([s.size[1], s.size[0], s.size[0]])
    signs = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], float)
    return (signs * half) @ quat_to_matrix(s.quat).T + np.array(s.pos)


def shape_contains(s: Shape, point: np.ndarray, tol: float = 1e-3) -> bool:
    """Whether an object-frame point lies in (or within ``tol`` of) a shape."""
    local = quat_to_matrix(s.quat).T @ (np.asarray(point, float) - np.array(s.pos))
    if s.kind == "box":
        return bool(np.all(np.abs(local) <= np.array(s.size) + tol))
    radius, half_length = s.size[0], s.size[1]
    return bool(abs(local[0]) <= half_length + tol and math.hypot(local[1], local[2]) <= radius + tol)


def joint_transform(joint: Joint, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(R, t) mapping object-frame points of the child at position 0 to their place at position q."""
    axis, origin = np.array(joint.axis), np.array(joint.origin)
    if joint.type == "prismatic":
        return np.eye(3), axis * q
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    rot = np.eye(3) + math.sin(q) * k + (1 - math.cos(q)) * (k @ k)
    return rot, origin - rot @ origin


def link_frame(link: Link) -> tuple[np.ndarray, np.ndarray]:
    """Rotation and origin of a link's frame in the object frame: the joint frame (x along the joint axis,
    as PhysX joints expect) for a movable link, the identity for the root."""
    if link.joint is None:
        return np.eye(3), np.zeros(3)
    return quat_to_matrix(quat_x_to(link.joint.axis)), np.array(link.joint.origin)


def _box(size: Vec3, pos: Vec3, colour: Vec3, label: str) -> Shape:
    return Shape("box", tuple(float(v) for v in size), tuple(float(v) for v in pos), IDENTITY, colour, label)


def _cylinder(radius: float, half_length: float, pos: Vec3, axis: Vec3, colour: Vec3, label: str) -> Shape:
    return Shape(
        "cylinder",
        (float(radius), float(half_length), 0.0),
        tuple(float(v) for v in pos),
        quat_x_to(axis),
        colour,
        label,
    )


# ------------------------------------------------------------------------------------------- parts kit


class _Kit:
    """Seeded drawing helpers shared by the category generators."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def u(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))

    def colour(self) -> Vec3:
        hue = self.rng.uniform(0, 1)
        base = np.array([abs(hue * 6 - 3) - 1, 2 - abs(hue * 6 - 2), 2 - abs(hue * 6 - 4)]).clip(0, 1)
        mix = self.u(0.35, 0.75)
        return tuple(float(v) for v in (mix * base + (1 - mix) * self.u(0.3, 0.9)).clip(0.05, 0.95))

    def handle_colour(self) -> Vec3:
        return HANDLE_COLOURS[int(self.rng.integers(len(HANDLE_COLOURS)))]

    def joint_physics(self) -> tuple[float, float]:
        return self.u(0.0, 0.6), self.u(0.2, 2.0)  # friction, damping

    def handle(self, front: Vec3, normal: Vec3, along: Vec3, length: float) -> tuple[Shape, ...]:
        """A handle standing off a panel at ``front`` (on its outer surface), facing ``normal``: a bar
        (box or round) ``length`` long along ``along`` on two posts, or a round knob."""
        style = int(self.rng.integers(3))
        colour = self.handle_colour()
        n, a, f = np.array(normal), np.array(along), np.array(front)
        standoff = self.u(0.025, 0.04)
        if style == 2:  # knob
            radius = self.u(0.015, 0.025)
            return (_cylinder(radius, standoff / 2, tuple(f + n * standoff / 2), normal, colour, "handle"),)
        thick = self.u(0.008, 0.014)
        bar_centre = f + n * (standoff - thick)
        if style == 0:
            size = np.abs(a) * length / 2 + (1 - np.abs(a)) * thick
            bar = _box(tuple(size), tuple(bar_centre), colour, "handle")
        else:
            bar = _cylinder(thick, length / 2, tuple(bar_centre), along, colour, "handle")
        posts = tuple(
            _box(
                tuple(np.abs(n) * (standoff - thick) / 2 + (1 - np.abs(n)) * thick * 0.8),
                tuple(f + n * (standoff - thick) / 2 + a * side * length * 0.4),
                colour,
                "handle",
            )
            for side in (-1, 1)
        )
        return (bar, *posts)


def _body(kit: _Kit, w: float, d: float, h: float, z0: float = 0.0) -> Shape:
    return _box((d / 2, w / 2, h / 2), (0.0, 0.0, z0 + h / 2), kit.colour(), "body")


def _side_door(
    kit: _Kit,
    name: str,
    y0: float,
    y1: float,
    z0: float,
    z1: float,
    front_x: float,
    hinge_at_low_y: bool,
    label: str = "door",
    handle_length: float | None = None,
) -> Link:
    """A door panel on the front face, hinged on a vertical edge; the handle sits near the free edge."""
    t = kit.u(0.015, 0.03)
    colour = kit.colour()
    panel = _box(
        (t / 2, (y1 - y0) / 2 - 0.003, (z1 - z0) / 2 - 0.003),
        (front_x - t / 2, (y0 + y1) / 2, (z0 + z1) / 2),
        colour,
        label,
    )
    free_y = y1 - 0.12 * (y1 - y0) if hinge_at_low_y else y0 + 0.12 * (y1 - y0)
    zh = z0 + kit.u(0.35, 0.65) * (z1 - z0)
    length = handle_length or min(0.6 * (z1 - z0), kit.u(0.08, 0.25))
    handle = kit.handle((front_x - t, free_y, zh), (-1.0, 0.0, 0.0), (0.0, 0.0, 1.0), length)
    hinge_y = y0 if hinge_at_low_y else y1
    friction, damping = kit.joint_physics()
    joint = Joint(
        "revolute",
        (front_x - t / 2, hinge_y, (z0 + z1) / 2),
        (0.0, 0.0, 1.0 if hinge_at_low_y else -1.0),
        (0.0, kit.u(1.6, 2.2)),
        friction,
        damping,
    )
    return Link(name, label, (panel, *handle), joint)


def _drawer(kit: _Kit, name: str, w: float, d: float, z0: float, z1: float, front_x: float) -> Link:
    """A drawer: front panel flush with the body's front plus a tray inside, sliding out along -x."""
    t = kit.u(0.015, 0.03)
    colour = kit.colour()
    height = z1 - z0 - 0.01
    front = _box((t / 2, w / 2 - 0.005, height / 2), (front_x - t / 2, 0.0, (z0 + z1) / 2), colour, "drawer")
    depth = 0.8 * d
    tray = _box(
        (depth / 2, w / 2 - 0.03, height * 0.35), (front_x + depth / 2, 0.0, (z0 + z1) / 2), colour, "drawer"
    )
    length = min(0.7 * w, kit.u(0.1, 0.3))
    handle = kit.handle(
        (front_x - t, 0.0, (z0 + z1) / 2 + kit.u(-0.2, 0.2) * height),
        (-1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        length,
    )
    friction, damping = kit.joint_physics()
    joint = Joint(
        "prismatic", (front_x, 0.0, (z0 + z1) / 2), (-1.0, 0.0, 0.0), (0.0, 0.7 * depth), friction, damping
    )
    return Link(name, "drawer", (front, tray, *handle), joint)


def _top_lid(
    kit: _Kit,
    name: str,
    w: float,
    d: float,
    top_z: float,
    label: str = "lid",
    with_handle: bool = True,
    round_radius: float = 0.0,
    centre_x: float = 0.0,
) -> Link:
    """A lid lying on top (centred at ``centre_x``), hinged along its back (+x) edge; lifting the front opens
    it."""
    t = kit.u(0.015, 0.04) if label == "lid" else kit.u(0.008, 0.015)
    colour = kit.colour()
    if round_radius:
        plate = _cylinder(round_radius, t / 2, (centre_x, 0.0, top_z + t / 2), (0.0, 0.0, 1.0), colour, label)
        front_x = centre_x - round_radius
    else:
        plate = _box((d / 2, w / 2, t / 2), (centre_x, 0.0, top_z + t / 2), colour, label)
        front_x = centre_x - d / 2
    shapes: tuple[Shape, ...] = (plate,)
    if with_handle:
        shapes += kit.handle(
            (front_x, 0.0, top_z + t / 2), (-1.0, 0.0, 0.0), (0.0, 1.0, 0.0), min(0.5 * w, kit.u(0.06, 0.18))
        )
    friction, damping = kit.joint_physics()
    back_x = centre_x + (round_radius if round_radius else d / 2)
    joint = Joint(
        "revolute", (back_x, 0.0, top_z + t / 2), (0.0, 1.0, 0.0), (0.0, kit.u(1.4, 2.0)), friction, damping
    )
    return Link(name, label, shapes, joint)


# ------------------------------------------------------------------------------------------ categories


def _drawer_cabinet(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.5, 0.9), kit.u(0.4, 0.6), kit.u(0.5, 1.0)
    n = int(kit.rng.integers(1, 4))
    plinth = kit.u(0.03, 0.08)
    edges = np.linspace(plinth, h - 0.03, n + 1)
    drawers = tuple(
        _drawer(kit, f"drawer_{i}", w - 0.04, d, edges[i], edges[i + 1], -d / 2) for i in range(n)
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), *drawers)


def _cabinet_door(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.4, 0.8), kit.u(0.35, 0.55), kit.u(0.5, 1.1)
    door = _side_door(
        kit, "door_0", -w / 2 + 0.01, w / 2 - 0.01, 0.05, h - 0.02, -d / 2, bool(kit.rng.integers(2))
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), door)


def _refrigerator(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.55, 0.8), kit.u(0.55, 0.7), kit.u(1.4, 1.9)
    split = h * kit.u(0.55, 0.7)
    low_y = bool(kit.rng.integers(2))
    doors = (
        _side_door(kit, "door_0", -w / 2, w / 2, 0.05, split, -d / 2, low_y, handle_length=0.5 * split),
        _side_door(
            kit, "door_1", -w / 2, w / 2, split + 0.01, h, -d / 2, low_y, handle_length=0.5 * (h - split)
        ),
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), *doors)


def _microwave(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.45, 0.65), kit.u(0.35, 0.45), kit.u(0.28, 0.38)
    door_w = w * kit.u(0.68, 0.8)
    body = _body(kit, w, d, h)
    panel = _box(
        (0.005, (w - door_w) / 2 - 0.01, h / 2 - 0.02),
        (-d / 2 - 0.005, -w / 2 + (w - door_w) / 2, h / 2),
        (0.1, 0.1, 0.12),
        "body",
    )
    door = _side_door(
        kit, "door_0", -w / 2 + (w - door_w), w / 2, 0.01, h - 0.01, -d / 2, False, handle_length=0.6 * h
    )
    return (Link("body", "body", (body, panel)), door)


def _box_lid(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.35, 0.7), kit.u(0.3, 0.5), kit.u(0.2, 0.45)
    return (Link("body", "body", (_body(kit, w, d, h),)), _top_lid(kit, "lid_0", w, d, h))


def _laptop(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.3, 0.42), kit.u(0.22, 0.3), kit.u(0.015, 0.03)
    base = _box((d / 2, w / 2, h / 2), (0.0, 0.0, h / 2), kit.colour(), "body")
    return (
        Link("body", "body", (base,)),
        _top_lid(kit, "screen_0", w, d, h, label="screen", with_handle=False),
    )


def _oven(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.5, 0.75), kit.u(0.5, 0.65), kit.u(0.7, 0.95)
    door_top = h * kit.u(0.65, 0.8)
    t = kit.u(0.02, 0.035)
    colour = kit.colour()
    z0 = 0.08
    panel = _box(
        (t / 2, w / 2 - 0.01, (door_top - z0) / 2), (-d / 2 - t / 2, 0.0, (z0 + door_top) / 2), colour, "door"
    )
    handle = kit.handle(
        (-d / 2 - t, 0.0, door_top - 0.12 * (door_top - z0)),
        (-1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        min(0.7 * w, kit.u(0.25, 0.5)),
    )
    friction, damping = kit.joint_physics()
    joint = Joint(
        "revolute", (-d / 2 - t / 2, 0.0, z0), (0.0, -1.0, 0.0), (0.0, kit.u(1.3, 1.57)), friction, damping
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), Link("door_0", "door", (panel, *handle), joint))


def _trash_can(kit: _Kit) -> tuple[Link, ...]:
    radius, h = kit.u(0.15, 0.25), kit.u(0.4, 0.7)
    body = _cylinder(radius, h / 2, (0.0, 0.0, h / 2), (0.0, 0.0, 1.0), kit.colour(), "body")
    lid = _top_lid(kit, "lid_0", 2 * radius, 2 * radius, h, round_radius=radius * 1.02)
    return (Link("body", "body", (body,)), lid)


def _wardrobe(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.8, 1.2), kit.u(0.45, 0.6), kit.u(1.5, 2.0)
    doors = (
        _side_door(kit, "door_0", -w / 2, -0.005, 0.06, h - 0.02, -d / 2, True, handle_length=0.3 * h),
        _side_door(kit, "door_1", 0.005, w / 2, 0.06, h - 0.02, -d / 2, False, handle_length=0.3 * h),
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), *doors)


def _table_drawer(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.7, 1.1), kit.u(0.45, 0.7), kit.u(0.65, 0.8)
    colour = kit.colour()
    top_t, apron = kit.u(0.03, 0.05), kit.u(0.12, 0.18)
    leg = kit.u(0.03, 0.05)
    shapes = [
        _box((d / 2, w / 2, top_t / 2), (0.0, 0.0, h - top_t / 2), colour, "body"),
        _box((d / 2 - 0.02, w / 2 - 0.02, apron / 2), (0.02, 0.0, h - top_t - apron / 2), colour, "body"),
    ]
    for sx in (-1, 1):
        for sy in (-1, 1):
            shapes.append(
                _box(
                    (leg / 2, leg / 2, (h - top_t) / 2),
                    (sx * (d / 2 - leg), sy * (w / 2 - leg), (h - top_t) / 2),
                    colour,
                    "body",
                )
            )
    drawer = _drawer(
        kit, "drawer_0", w * kit.u(0.4, 0.6), d - 0.04, h - top_t - apron, h - top_t, -d / 2 + 0.02
    )
    return (Link("body", "body", tuple(shapes)), drawer)


def _washing_machine(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.55, 0.65), kit.u(0.5, 0.6), kit.u(0.8, 0.9)
    side = kit.u(0.32, 0.4) * w
    z0 = h * kit.u(0.2, 0.3)
    door = _side_door(
        kit, "door_0", -side, side, z0, z0 + 2 * side, -d / 2, bool(kit.rng.integers(2)), handle_length=side
    )
    return (Link("body", "body", (_body(kit, w, d, h),)), door)


def _toilet(kit: _Kit) -> tuple[Link, ...]:
    w, d, h = kit.u(0.35, 0.45), kit.u(0.5, 0.65), kit.u(0.38, 0.45)
    tank_d, tank_h = kit.u(0.16, 0.22), kit.u(0.3, 0.4)
    colour = kit.colour()
    bowl = _box((d / 2, w / 2, h / 2), (0.0, 0.0, h / 2), colour, "body")
    tank = _box((tank_d / 2, w / 2, tank_h / 2), (d / 2 - tank_d / 2, 0.0, h + tank_h / 2), colour, "body")
    seat_d = d - tank_d
    lid = _top_lid(kit, "lid_0", w - 0.02, seat_d - 0.01, h, centre_x=-d / 2 + seat_d / 2)
    return (Link("body", "body", (bowl, tank)), lid)


GENERATORS: dict[str, Callable[[_Kit], tuple[Link, ...]]] = {
    "drawer_cabinet": _drawer_cabinet,
    "cabinet_door": _cabinet_door,
    "refrigerator": _refrigerator,
    "microwave": _microwave,
    "box_lid": _box_lid,
    "laptop": _laptop,
    "oven": _oven,
    "trash_can": _trash_can,
    "wardrobe": _wardrobe,
    "table_drawer": _table_drawer,
    "washing_machine": _washing_machine,
    "toilet": _toilet,
}
SEEN_CATEGORIES: tuple[str, ...] = (
    "drawer_cabinet",
    "cabinet_door",
    "refrigerator",
    "microwave",
    "box_lid",
    "laptop",
)
UNSEEN_CATEGORIES: tuple[str, ...] = ("oven", "trash_can", "wardrobe", "table_drawer")
ASSET_ONLY_CATEGORIES: tuple[str, ...] = ("washing_machine", "toilet")
#: per-category seed salt; the procedural split's categories keep the salt they had before the asset-only ones
#: were added, so their instances never change
_SALT = {
    name: i for i, name in enumerate((*sorted(SEEN_CATEGORIES + UNSEEN_CATEGORIES), *ASSET_ONLY_CATEGORIES))
}
#: What a person calls each category in a prompt.
DISPLAY_NAMES: dict[str, str] = {
    "drawer_cabinet": "drawer cabinet",
    "cabinet_door": "cabinet",
    "refrigerator": "refrigerator",
    "microwave": "microwave",
    "box_lid": "storage box",
    "laptop": "laptop",
    "oven": "oven",
    "trash_can": "trash can",
    "wardrobe": "wardrobe",
    "table_drawer": "desk",
    "washing_machine": "washing machine",
    "toilet": "toilet",
}


def make_object(category: str, seed: int) -> ArticulatedObject:
    """Build the instance ``seed`` of ``category``, scaled by a random factor in [0.7, 1.2] of unit size."""
    if category not in GENERATORS:
        raise KeyError(f"unknown object category {category!r}; known: {', '.join(GENERATORS)}")
    kit = _Kit(seed * 7919 + _SALT[category])
    links = GENERATORS[category](kit)
    obj = ArticulatedObject(category, seed, links)
    lo, hi = obj.bounds()
    factor = kit.u(0.7, 1.2) / float(np.max(hi - lo))
    return _scaled(obj, factor)


def _scaled(obj: ArticulatedObject, f: float) -> ArticulatedObject:
    def shape(s: Shape) -> Shape:
        size = (s.size[0] * f, s.size[1] * f, 0.0) if s.kind == "cylinder" else tuple(v * f for v in s.size)
        return replace(s, size=size, pos=tuple(v * f for v in s.pos))

    def joint(j: Joint | None) -> Joint | None:
        if j is None:
            return None
        limits = (j.limits[0] * f, j.limits[1] * f) if j.type == "prismatic" else j.limits
        return replace(j, origin=tuple(v * f for v in j.origin), limits=limits)

    links = tuple(
        replace(link, shapes=tuple(shape(s) for s in link.shapes), joint=joint(link.joint))
        for link in obj.links
    )
    return replace(obj, links=links)


def split_categories(split: str) -> tuple[str, ...]:
    """Categories of a split: ``train``/``seen`` use the seen categories, ``unseen`` the held-out ones."""
    if split in ("train", "seen"):
        return SEEN_CATEGORIES
    if split == "unseen":
        return UNSEEN_CATEGORIES
    raise ValueError(f"unknown split {split!r}; expected train, seen or unseen")


def instance_seed(split: str, index: int, base_seed: int) -> int:
    """Instance seeds: train draws below HELD_OUT_SEED_START, seen/unseen tests from it (held-out instances)."""
    split_categories(split)
    rng = np.random.default_rng([base_seed, index, {"train": 0, "seen": 1, "unseen": 2}[split]])
    start = 0 if split == "train" else HELD_OUT_SEED_START
    return start + int(rng.integers(HELD_OUT_SEED_START))
