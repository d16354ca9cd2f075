"""Pinhole cameras around an object: sampling, projection, physics raycasts and (optional) rendering.

Camera frame (SAPIEN's): x forward, y left, z up. Pixels are continuous coordinates in the ORIGINAL image,
pixel (i, j) covering [j, j+1) x [i, i+1), so its centre is (j + 0.5, i + 0.5). Poses follow ManipLLM's
ranges (elevation pi/6..pi/3, azimuth 0.7pi..1.3pi around the front, fov 35 deg). ``sample_camera`` (the
simple protocol) scales the distance to the object's size and looks at its centre, so the object fills
roughly half the frame; ``sample_manipllm_camera`` is ManipLLM's own (``data_collection/code/camera.py``):
distance 4.5..5.5 from the origin, looking at it.
Without Vulkan, a raycast through a pixel gives the same depth, surface normal and link as rendering.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from vlm_grpoma.envs.sapien.objects import matrix_to_quat
from vlm_grpoma.envs.sapien.scene import BuiltScene
from vlm_grpoma.envs.sapien.vulkan import import_sapien

FOVY_DEG = 35.0
ELEVATION = (math.pi / 6, math.pi / 3)
AZIMUTH = (0.7 * math.pi, 1.3 * math.pi)
DISTANCE_PER_EXTENT = (2.4, 3.0)
MANIPLLM_DISTANCE = (4.5, 5.5)
NEAR, FAR = 0.01, 50.0


@dataclass(frozen=True)
class CameraSpec:
    position: tuple[float, float, float]
    target: tuple[float, float, float]
    width: int = 336
    height: int = 336
    fovy_deg: float = FOVY_DEG

    @classmethod
    def from_json(cls, data: dict) -> CameraSpec:
        return cls(
            tuple(data["position"]),
            tuple(data["target"]),
            int(data["width"]),
            int(data["height"]),
            float(data["fovy_deg"]),
        )

    def to_json(self) -> dict:
        return asdict(self) | {"position": list(self.position), "target": list(self.target)}

    def rotation(self) -> np.ndarray:
        """World-from-camera rotation; columns are the camera's forward, left and up axes."""
        forward = np.subtract(self.target, self.position)
        forward = forward / np.linalg.norm(forward)
        left = np.cross([0.0, 0.0, 1.0], forward)
        left = left / np.linalg.norm(left)
        return np.stack([forward, left, np.cross(forward, left)], axis=1)

    @property
    def focal(self) -> float:
        return self.height / 2 / math.tan(math.radians(self.fovy_deg) / 2)

    def pixel_ray(self, x: float, y: float) -> np.ndarray:
        """Unit world direction through pixel coordinates (x, y)."""
        d_cam = np.array([1.0, -(x - self.width / 2) / self.focal, -(y - self.height / 2) / self.focal])
        d = self.rotation() @ d_cam
        return d / np.linalg.norm(d)

    def pixel_rays(self, xy: np.ndarray) -> np.ndarray:
        """Unit world directions [N, 3] through pixel coordinates [N, 2]."""
        xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        d_cam = np.stack(
            [
                np.ones(len(xy)),
                -(xy[:, 0] - self.width / 2) / self.focal,
                -(xy[:, 1] - self.height / 2) / self.focal,
            ],
            axis=1,
        )
        d = d_cam @ self.rotation().T
        return d / np.linalg.norm(d, axis=1, keepdims=True)

    def project(self, points: np.ndarray) -> np.ndarray:
        """World points [N, 3] -> pixel coordinates [N, 2] (points must be in front of the camera)."""
        cam = (np.asarray(points, float) - np.array(self.position)) @ self.rotation()
        return np.stack(
            [
                self.width / 2 - self.focal * cam[:, 1] / cam[:, 0],
                self.height / 2 - self.focal * cam[:, 2] / cam[:, 0],
            ],
            axis=1,
        )

    def to_camera(self, vector: np.ndarray) -> np.ndarray:
        return self.rotation().T @ np.asarray(vector, float)

    def to_world(self, vector: np.ndarray) -> np.ndarray:
        return self.rotation() @ np.asarray(vector, float)


def _looking_at(
    centre: np.ndarray, distance: float, elevation: float, azimuth: float, width: int, height: int
) -> CameraSpec:
    offset = distance * np.array(
        [
            math.cos(elevation) * math.cos(azimuth),
            math.cos(elevation) * math.sin(azimuth),
            math.sin(elevation),
        ]
    )
    return CameraSpec(
        tuple(float(v) for v in centre + offset), tuple(float(v) for v in centre), width, height
    )


def sample_camera(
    rng: np.random.Generator, bounds: tuple[np.ndarray, np.ndarray], width: int = 336, height: int = 336
) -> CameraSpec:
    """A ManipLLM-like viewpoint looking at the centre of the object's bounds (lo, hi)."""
    lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
    extent = float(np.linalg.norm(hi - lo))
    elevation = rng.uniform(*ELEVATION)
    azimuth = rng.uniform(*AZIMUTH)
    distance = extent * rng.uniform(*DISTANCE_PER_EXTENT)
    return _looking_at((lo + hi) / 2, distance, elevation, azimuth, width, height)


def sample_manipllm_camera(rng: np.random.Generator, width: int = 336, height: int = 336) -> CameraSpec:
    """ManipLLM's viewpoint: elevation, azimuth and distance drawn in its order, looking at the origin."""
    elevation = rng.uniform(*ELEVATION)
    azimuth = rng.uniform(*AZIMUTH)
    distance = rng.uniform(*MANIPLLM_DISTANCE)
    return _looking_at(np.zeros(3), distance, elevation, azimuth, width, height)


@dataclass(frozen=True)
class Hit:
    """What a pixel sees: world point, outward surface normal, the part (link name) and its label."""

    point: np.ndarray
    normal: np.ndarray
    link: str
    label: str
    distance: float


def raycast(built: BuiltScene, camera: CameraSpec, x: float, y: float) -> Hit | None:
    """Physics raycast through a pixel; None when the ray misses the object."""
    origin = np.array(camera.position)
    direction = camera.pixel_ray(x, y)
    hit = built.scene.physx_system.raycast(origin, direction, FAR)
    name = _part_hit(built, hit)
    if name is None:
        return None
    point = np.asarray(hit.position, dtype=np.float64)
    normal = np.asarray(hit.normal, dtype=np.float64)
    if normal @ direction > 0:
        normal = -normal
    return Hit(point, normal, name, built.label_at(name, point), float(hit.distance))


def _part_hit(built: BuiltScene, hit) -> str | None:
    """The part a physics ray hit belongs to, or None for a miss or something that is not the object."""
    if hit is None or hit.component is None:
        return None
    return built.owner.get(hit.component.name)


def part_names(built: BuiltScene) -> list[str]:
    """Parts in link order: the indices of ``raycast_image`` and ``Views.link_ids``."""
    return list(dict.fromkeys(built.owner.values()))


def raycast_image(
    built: BuiltScene, camera: CameraSpec, stride: int = 1, only_object: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Depth along the ray [H, W] (inf where empty) and part index map [H, W] (into ``part_names``, -1 where
    empty), by raycasts through pixel centres; ``stride`` subsamples rows and columns; ``only_object`` casts
    only inside the image box of the object's bounds (the rest is empty)."""
    names = part_names(built)
    ys, xs = np.mgrid[0 : camera.height : stride, 0 : camera.width : stride]
    centres = np.stack([xs + 0.5, ys + 0.5], axis=-1).reshape(-1, 2)
    todo = np.ones(len(centres), dtype=bool)
    if only_object:
        lo, hi = built.bounds()
        corners = np.array(
            [[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
        )
        box = camera.project(corners)
        todo = np.all((centres >= box.min(0) - stride) & (centres <= box.max(0) + stride), axis=1)
    depth = np.full(len(centres), np.inf)
    links = np.full(len(centres), -1, dtype=np.int32)
    origin = np.array(camera.position)
    raycast_one = built.scene.physx_system.raycast
    for k, direction in zip(np.flatnonzero(todo), camera.pixel_rays(centres[todo])):
        hit = raycast_one(origin, direction, FAR)
        name = _part_hit(built, hit)
        if name is not None:
            depth[k] = hit.distance
            links[k] = names.index(name)
    return depth.reshape(xs.shape), links.reshape(xs.shape)


@dataclass
class Views:
    """Rendered buffers: RGB uint8 [H, W, 3]; world points [H, W, 3] and depth along the camera's forward
    axis [H, W] (NaN on background); the part under each pixel via ``link_ids`` [H, W] (index into
    ``link_names``, the part names; -1 on background); render-shape ids [H, W] (Segmentation channel 0)."""

    rgb: np.ndarray
    points: np.ndarray
    depth: np.ndarray
    link_ids: np.ndarray
    link_names: list[str]
    shape_ids: np.ndarray

    def mask(self, link: str) -> np.ndarray:
        return self.link_ids == self.link_names.index(link)


_RENDER_KEEPALIVE: list = []


def render(built: BuiltScene, camera: CameraSpec, background: tuple[int, int, int] | None = None) -> Views:
    """Render RGB, position and segmentation (the scene must have been built with ``render=True``);
    ``background`` replaces the RGB of pixels showing no object. One extra render system stays alive for
    the process: when the last one is destroyed SAPIEN drops its Vulkan context and the next frame pays the
    multi-second pipeline build again."""
    sapien = import_sapien()
    if not _RENDER_KEEPALIVE:
        _RENDER_KEEPALIVE.append(sapien.render.RenderSystem())
    cam = built.scene.add_camera(
        "camera", camera.width, camera.height, math.radians(camera.fovy_deg), NEAR, FAR
    )
    rot = camera.rotation()
    cam.entity.set_pose(sapien.Pose(camera.position, matrix_to_quat(rot)))
    built.scene.update_render()
    cam.take_picture()
    rgb = (np.clip(cam.get_picture("Color")[..., :3], 0, 1) * 255).round().astype(np.uint8)
    position = cam.get_picture("Position")
    seg = cam.get_picture("Segmentation")
    model = np.asarray(cam.get_model_matrix())
    homogeneous = np.concatenate([position[..., :3], np.ones_like(position[..., :1])], axis=-1)
    points = (homogeneous @ model.T)[..., :3].astype(np.float64)
    names = part_names(built)
    scene_ids = [c.entity.per_scene_id for c in built.link_components.values()]
    lookup = np.full(max(int(seg[..., 1].max()), *scene_ids) + 1, -1, dtype=np.int32)
    lookup[scene_ids] = [names.index(built.owner[name]) for name in built.link_components]
    link_ids = lookup[seg[..., 1].astype(np.int64)]
    points[link_ids < 0] = np.nan
    if background is not None:
        rgb[link_ids < 0] = background
    depth = -position[..., 2].astype(np.float64)  # OpenGL camera space looks down -z
    depth[link_ids < 0] = np.nan
    built.scene.remove_camera(cam)
    return Views(rgb, points, depth, link_ids, names, seg[..., 0].astype(np.int32))


def handle_shape_ids(built: BuiltScene, link: str) -> set[int]:
    """Render-shape ids (Segmentation channel 0) of a link's shapes labelled ``handle``."""
    sapien = import_sapien()
    entity = built.link_components[link].entity
    body = entity.find_component_by_type(sapien.render.RenderBodyComponent)
    labels = [s.label for s in built.obj.link(link).shapes]
    return {shape.per_scene_id for shape, label in zip(body.render_shapes, labels) if label == "handle"}
