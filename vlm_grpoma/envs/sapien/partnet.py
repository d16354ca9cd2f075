"""PartNet-Mobility object folders: read, validate, list.

A folder ``<id>/`` holds ``mobility.urdf`` (meshes under ``textured_objs/``), ``meta.json`` (``model_cat``:
the category), ``semantics.txt`` (one ``<link> <joint kind> <label>`` line per link, e.g. ``link_0 hinge
door``) and ``mobility_v2.json`` (the part tree). ``read_asset`` checks all four and names the file at fault;
``scan_assets`` reads every object folder under a root. Which links an episode may act on follows ManipLLM
(``env.py``: every link whose joint has one degree of freedom: revolute, continuous or prismatic); the
semantics name those parts (door, drawer, lid, ...) in prompts and reports.

Every mesh and texture the URDF names must lie inside the object folder (``urdf.resolve_asset_path``), and
every mesh is read up front (an OBJ needs vertices and faces, an STL triangles), because the physics engine
drops a link's shape it cannot read with only a log line.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.envs.sapien.urdf import resolve_asset_path
from vlm_grpoma.errors import DataError

URDF_NAME, META_NAME, SEMANTICS_NAME, MOBILITY_NAME = (
    "mobility.urdf",
    "meta.json",
    "semantics.txt",
    "mobility_v2.json",
)
JOINT_TYPES = ("fixed", "revolute", "continuous", "prismatic", "floating", "planar")


@dataclass(frozen=True)
class PartNetAsset:
    """One object: its folder name (the PartNet-Mobility annotation id), category and per-link labels."""

    asset_id: str
    category: str
    folder: Path
    labels: dict[str, str]  # link name -> semantic label (semantics.txt)

    @property
    def urdf(self) -> Path:
        return self.folder / URDF_NAME


def _load_json(path: Path):
    if not path.is_file():
        raise DataError(
            f"{path}: missing (a PartNet-Mobility folder has {URDF_NAME}, {META_NAME}, "
            f"{SEMANTICS_NAME} and {MOBILITY_NAME})"
        )
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None


def _obj_problem(lines: Iterable[str]) -> str | None:
    """Why OBJ text is no mesh: a malformed vertex, or fewer than 3 vertices or no face (read until both)."""
    vertices = faces = 0
    for line in lines:
        fields = line.split()
        if fields[:1] == ["v"]:
            try:
                finite = len(fields) >= 4 and all(math.isfinite(float(v)) for v in fields[1:4])
            except ValueError:
                finite = False
            if not finite:
                return f"an OBJ whose vertex line {line.strip()[:40]!r} is not 'v x y z' with finite numbers"
            vertices += 1
        elif fields[:1] == ["f"]:
            faces += 1
        if vertices >= 3 and faces:
            return None
    return f"an OBJ with {vertices} vertices and {faces} faces (not a mesh)"


def _stl_problem(data: bytes) -> str | None:
    if data[:5].lower() == b"solid" and data.count(b"vertex") >= 3:
        return None  # ASCII STL
    triangles = int.from_bytes(data[80:84], "little") if len(data) >= 84 else 0
    if triangles and len(data) == 84 + 50 * triangles:
        return None
    return "an STL without triangles (binary size does not match its count, no ASCII vertices)"


def mesh_problem(file: Path) -> str | None:
    """Why the physics engine or renderer could not read ``file`` as a mesh (OBJ and STL parsed; other formats
    must be a non-empty regular file), else None. A regular file only is opened (a FIFO would block)."""
    if not file.exists():
        return "missing"
    if not file.is_file():
        return "not a regular file"
    try:
        if file.stat().st_size == 0:
            return "empty"
        suffix = file.suffix.lower()
        if suffix == ".obj":
            with file.open(encoding="utf-8", errors="replace") as lines:
                return _obj_problem(lines)
        if suffix == ".stl":
            return _stl_problem(file.read_bytes())
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    return None


def _check_urdf(path: Path) -> set[str]:
    """Parse and check a mobility.urdf (joints, limits, mesh files); returns its link names."""
    if not path.is_file():
        raise DataError(f"{path}: missing (not a PartNet-Mobility object folder)")
    try:
        robot = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise DataError(f"{path}: not valid URDF XML ({err})") from None
    if robot.tag != "robot":
        raise DataError(f"{path}: the root element is <{robot.tag}>, expected <robot>")
    links = {link.get("name") for link in robot.findall("link")}
    for joint in robot.findall("joint"):
        name, kind = joint.get("name"), joint.get("type")
        if kind not in JOINT_TYPES:
            raise DataError(f"{path}: joint {name!r} has unknown type {kind!r}")
        for end in ("parent", "child"):
            element = joint.find(end)
            if element is None or element.get("link") not in links:
                raise DataError(
                    f"{path}: joint {name!r} has no valid <{end} link=...> (links: {sorted(links)})"
                )
        limit = joint.find("limit")
        if kind in ("revolute", "prismatic"):
            try:
                lower, upper = float(limit.get("lower", "0")), float(limit.get("upper", "0"))
            except (AttributeError, ValueError):
                raise DataError(
                    f"{path}: joint {name!r} ({kind}) needs a numeric <limit lower upper>"
                ) from None
            if lower > upper:
                raise DataError(f"{path}: joint {name!r} has lower limit {lower} above upper {upper}")
    for texture in robot.iter("texture"):
        if texture.get("filename"):
            resolve_asset_path(texture.get("filename"), path)  # inside the folder, or DataError
    for link in robot.findall("link"):
        for mesh in link.iter("mesh"):
            name = mesh.get("filename", "")
            problem = mesh_problem(resolve_asset_path(name, path)) if name else "missing"
            if problem is not None:
                raise DataError(f"{path}: link {link.get('name')!r} uses mesh {name!r}, which is {problem}")
    return links


def read_semantics(path: Path, links: set[str] | None = None) -> dict[str, str]:
    """``semantics.txt`` as link -> label; every line must be ``<link> <joint kind> <label>``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    labels = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 3:
            raise DataError(f"{path}:{number}: expected '<link> <joint kind> <label>', got {line.strip()!r}")
        if links is not None and fields[0] not in links:
            raise DataError(f"{path}:{number}: link {fields[0]!r} is not in {URDF_NAME}")
        labels[fields[0]] = fields[2]
    return labels


def read_asset(folder: str | Path) -> PartNetAsset:
    """Read and validate one PartNet-Mobility object folder."""
    folder = Path(folder)
    links = _check_urdf(folder / URDF_NAME)
    meta = _load_json(folder / META_NAME)
    category = meta.get("model_cat") if isinstance(meta, dict) else None
    if not isinstance(category, str) or not category.strip():
        raise DataError(f"{folder / META_NAME}: needs a non-empty string 'model_cat' (the object category)")
    semantics = folder / SEMANTICS_NAME
    if not semantics.is_file():
        raise DataError(f"{semantics}: missing (one '<link> <joint kind> <label>' line per link)")
    labels = read_semantics(semantics, links)
    mobility = _load_json(folder / MOBILITY_NAME)
    if not isinstance(mobility, list) or not all(isinstance(p, dict) and "joint" in p for p in mobility):
        raise DataError(f"{folder / MOBILITY_NAME}: expected a list of parts, each with a 'joint' kind")
    return PartNetAsset(folder.name, category.strip(), folder.resolve(), labels)


def scan_assets(root: str | Path) -> list[PartNetAsset]:
    """Every object folder (a sub-folder holding mobility.urdf) under ``root``, sorted by id."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--assets {root}: not a folder")
    folders = sorted(
        (p for p in root.iterdir() if (p / URDF_NAME).is_file()),
        key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name),
    )
    if not folders:
        raise DataError(f"--assets {root}: no object folders (<id>/{URDF_NAME}) found")
    return [read_asset(folder) for folder in folders]


def link_labels(urdf_path: str | Path) -> dict[str, str]:
    """Labels from the ``semantics.txt`` next to a URDF file; empty where there is none."""
    semantics = Path(urdf_path).parent / SEMANTICS_NAME
    return read_semantics(semantics) if semantics.is_file() else {}


def display_name(category: str) -> str:
    """What a person calls a PartNet-Mobility category in a prompt: ``StorageFurniture`` -> storage furniture."""
    words, word = [], ""
    for char in category:
        if char.isupper() and word and not word[-1].isupper():
            words.append(word)
            word = ""
        word += char
    return " ".join([*words, word]).lower().replace("_", " ")
