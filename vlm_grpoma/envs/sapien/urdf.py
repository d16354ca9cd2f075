"""URDF for articulated objects: emit our procedural objects, load any URDF (e.g. PartNet-Mobility's
``mobility.urdf``) into a SAPIEN scene.

Emitted link frames equal the joint frames ``scene.build_scene`` uses (x along the joint axis), so a scene
loaded from the URDF matches one built directly. Loading gives a link that has visual meshes but no
collision its visual meshes as collision (so what the camera sees can be touched), strips ``<visual>``
elements unless rendering (visuals need a Vulkan device) and applies each joint's ``<dynamics friction>`` to
the built joint, because SAPIEN's loader passes it to a builder argument that PhysX ignores. Collision meshes
become convex shapes (``COLLISION_MODES``). ``scene.build_urdf_scene`` turns a loaded URDF into parts.

Mesh and texture paths stay inside the URDF's folder (the asset folder): a path that leads out of it (``../``,
an absolute path elsewhere, a ``package://`` name found only above it, a symlink pointing out) is refused
before anything reads it. A link whose collision meshes PhysX could not cook (SAPIEN only logs it and builds
the link without shapes) is refused after loading, naming the link.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from vlm_grpoma.envs.sapien.objects import ArticulatedObject, Shape, link_frame, quat_to_matrix
from vlm_grpoma.errors import DataError, MissingDependencyError

#: how a collision mesh file becomes PhysX shapes: ``convex`` one convex hull per file (SAPIEN's default, as
#: in ManipLLM's scenes), ``pieces`` one hull per mesh inside the file, ``coacd`` CoACD's approximate convex
#: decomposition of each file (needs the ``coacd`` package; slow the first time, then cached by SAPIEN)
COLLISION_MODES = ("convex", "pieces", "coacd")

# SAPIEN turns a URDF cylinder (axis z) into its own (axis x) with this rotation about y; we undo it.
_URDF_CYLINDER = np.array([[0.0, 0.0, -1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # Ry(-90 deg)


def _rpy(rot: np.ndarray) -> tuple[float, float, float]:
    """Roll, pitch, yaw with ``rot = Rz(yaw) Ry(pitch) Rx(roll)`` (URDF's convention)."""
    pitch = math.asin(max(-1.0, min(1.0, -rot[2, 0])))
    if abs(rot[2, 0]) < 1 - 1e-9:
        return math.atan2(rot[2, 1], rot[2, 2]), pitch, math.atan2(rot[1, 0], rot[0, 0])
    return math.atan2(-rot[1, 2], rot[1, 1]), pitch, 0.0


def _origin(parent: ET.Element, pos: np.ndarray, rot: np.ndarray) -> None:
    ET.SubElement(
        parent, "origin", xyz=" ".join(f"{v:.9g}" for v in pos), rpy=" ".join(f"{v:.9g}" for v in _rpy(rot))
    )


def _geometry(
    parent: ET.Element, tag: str, shape: Shape, frame_rot: np.ndarray, frame_origin: np.ndarray
) -> None:
    element = ET.SubElement(parent, tag, name=shape.label)
    rot = frame_rot.T @ quat_to_matrix(shape.quat)
    pos = frame_rot.T @ (np.array(shape.pos) - frame_origin)
    geometry = ET.Element("geometry")
    if shape.kind == "box":
        ET.SubElement(geometry, "box", size=" ".join(f"{2 * v:.9g}" for v in shape.size))
    else:
        rot = rot @ _URDF_CYLINDER
        ET.SubElement(geometry, "cylinder", radius=f"{shape.size[0]:.9g}", length=f"{2 * shape.size[1]:.9g}")
    _origin(element, pos, rot)
    element.append(geometry)
    if tag == "visual":
        material = ET.SubElement(
            element, "material", name=f"rgb_{'_'.join(f'{c:.3f}' for c in shape.colour)}"
        )
        ET.SubElement(material, "color", rgba=" ".join(f"{c:.4g}" for c in (*shape.colour, 1.0)))


def to_urdf(obj: ArticulatedObject) -> str:
    """URDF text of an object: one link per part with collision and visual primitives, one joint per part."""
    robot = ET.Element("robot", name=f"{obj.category}_{obj.seed}")
    root = obj.links[0]
    for link in obj.links:
        element = ET.SubElement(robot, "link", name=link.name)
        frame_rot, frame_origin = link_frame(link)
        for shape in link.shapes:
            _geometry(element, "visual", shape, frame_rot, frame_origin)
            _geometry(element, "collision", shape, frame_rot, frame_origin)
        if link.joint is not None:
            j = link.joint
            joint = ET.SubElement(robot, "joint", name=f"joint_{link.name}", type=j.type)
            _origin(joint, frame_origin, frame_rot)
            ET.SubElement(joint, "parent", link=root.name)
            ET.SubElement(joint, "child", link=link.name)
            ET.SubElement(joint, "axis", xyz="1 0 0")
            ET.SubElement(
                joint,
                "limit",
                lower=f"{j.limits[0]:.9g}",
                upper=f"{j.limits[1]:.9g}",
                effort="1000",
                velocity="10",
            )
            ET.SubElement(joint, "dynamics", damping=f"{j.damping:.9g}", friction=f"{j.friction:.9g}")
    ET.indent(robot)
    return ET.tostring(robot, encoding="unicode")


def resolve_asset_path(name: str, urdf: Path) -> Path:
    """A URDF mesh or texture path as a file inside the URDF's folder: relative to it, or for ``package://``
    names the first match in the folder or one of its parents (as ROS tools resolve them), which must lie in
    the folder (the folder being the package); DataError naming the URDF and the path when it leads out."""
    folder = Path(urdf).parent.resolve()
    package = name.startswith("package://")
    relative = name[len("package://") :] if package else name
    candidates = [base / relative for base in ((folder, *folder.parents) if package else (folder,))]
    found = next((path for path in candidates if path.is_file()), candidates[0])  # stat only, nothing read
    if not found.resolve().is_relative_to(folder):
        raise DataError(f"{urdf}: mesh path {name!r} leads out of the asset folder {folder}")
    return found


def prepare_urdf(urdf: str, *, render: bool, path: Path | None = None) -> str:
    """URDF text ready to load: links with visuals but no collision get their visuals as collision; without
    ``render`` every ``<visual>`` is removed (physics-only scenes have no renderer to take them); mesh and
    texture paths are made absolute against the folder of the URDF file ``path`` (and must stay inside it),
    so the text loads from anywhere."""
    robot = ET.fromstring(urdf)
    if path is not None:
        for element in (*robot.iter("mesh"), *robot.iter("texture")):
            if element.get("filename"):
                element.set("filename", str(resolve_asset_path(element.get("filename"), path)))
    for link in robot.iter("link"):
        visuals = link.findall("visual")
        if visuals and not link.findall("collision"):
            for visual in visuals:
                collision = copy.deepcopy(visual)
                collision.tag = "collision"
                for material in collision.findall("material"):
                    collision.remove(material)
                link.append(collision)
        if not render:
            for visual in visuals:
                link.remove(visual)
    return ET.tostring(robot, encoding="unicode")


def _links_with_collision(prepared: str) -> set[str]:
    return {
        link.get("name")
        for link in ET.fromstring(prepared).iter("link")
        if link.find("collision") is not None
    }


def joint_frictions(urdf: str) -> dict[str, float]:
    """Child link name -> ``<dynamics friction>`` of its joint (0 where absent)."""
    out = {}
    for joint in ET.fromstring(urdf).iter("joint"):
        child = joint.find("child")
        dynamics = joint.find("dynamics")
        if child is not None:
            out[child.get("link")] = float(dynamics.get("friction", 0)) if dynamics is not None else 0.0
    return out


def load_articulation(
    scene,
    urdf_path: str | Path,
    *,
    render: bool,
    density: float = 1000.0,
    scale: float = 1.0,
    material: tuple[float, float, float] | None = None,
    collision: str = "convex",
):
    """Load a URDF file as a fixed-root articulation scaled by ``scale``; ``material`` is (static friction,
    dynamic friction, restitution) of its collision shapes; ``collision`` one of ``COLLISION_MODES``."""
    if collision not in COLLISION_MODES:
        raise ValueError(f"unknown collision mode {collision!r}; choose one of {', '.join(COLLISION_MODES)}")
    if collision == "coacd" and importlib.util.find_spec("coacd") is None:
        raise MissingDependencyError(
            "collision mode coacd needs the coacd package (pip install coacd trimesh)"
        )
    path = Path(urdf_path)
    text = path.read_text()
    prepared = prepare_urdf(text, render=render, path=path)  # refuses paths out of the folder before loading
    loader = scene.create_urdf_loader()
    loader.fix_root_link = True
    loader.scale = scale
    loader.set_density(density)
    if material is not None:
        loader.set_material(*material)
    loader.load_multiple_collisions_from_file = collision != "convex"
    loader.multiple_collisions_decomposition = "coacd" if collision == "coacd" else "none"
    with tempfile.NamedTemporaryFile("w", suffix=".urdf", delete=True) as f:
        f.write(prepared)
        f.flush()
        articulation = loader.load(f.name)
    with_collision = _links_with_collision(prepared)
    dropped = sorted(
        link.name
        for link in articulation.get_links()
        if link.name in with_collision and not link.collision_shapes
    )
    if dropped:
        raise DataError(
            f"{path}: link(s) {', '.join(dropped)} lost every collision shape (a mesh the physics engine cannot "
            "read or cook, see the SAPIEN log above)"
        )
    frictions = joint_frictions(text)
    for joint in articulation.get_active_joints():
        joint.set_friction(frictions.get(joint.child_link.name, 0.0))
    return articulation
