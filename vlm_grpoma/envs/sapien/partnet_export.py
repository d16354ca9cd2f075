"""Procedural objects written as PartNet-Mobility folders (``vlm-grpoma make-assets``), so the asset path
runs end to end without the dataset (which needs a login to download).

A folder follows the real files' layout and quirks: ``mobility.urdf`` with a ``base`` link and the body
(the last ``link_N``) on a fixed joint rotated by rpy (pi/2, 0, -pi/2), meshes in PartNet's frame (y up,
z towards the front), one ``link_i`` per movable part whose frame sits at its joint origin (so its meshes
carry the opposite offset), several OBJ meshes per link (a handle's bar and posts in one file), the same
files as visual and collision, colours in ``.mtl`` files; ``meta.json`` (``model_cat``), ``semantics.txt``
and ``mobility_v2.json``. Objects are centred on the origin, as ManipLLM's camera expects. Categories map to
PartNet-Mobility's (``PARTNET_CATEGORIES``), seven seen and four unseen in ManipLLM's split. Ids start at
``FIRST_ID``, far above PartNet-Mobility's; each category gets a fifth of its ids (at least one) in the
split's test instances.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import numpy as np

from vlm_grpoma.envs.sapien.objects import (
    ArticulatedObject,
    Link,
    Shape,
    make_object,
    quat_to_matrix,
)
from vlm_grpoma.envs.sapien.partnet import META_NAME, MOBILITY_NAME, SEMANTICS_NAME, URDF_NAME
from vlm_grpoma.envs.sapien.splits import CategorySplit, load_split
from vlm_grpoma.errors import CommandError
from vlm_grpoma.output_folder import writable_folder

PARTNET_CATEGORIES: dict[str, str] = {
    "drawer_cabinet": "StorageFurniture",
    "wardrobe": "StorageFurniture",
    "cabinet_door": "Safe",
    "refrigerator": "Refrigerator",
    "microwave": "Microwave",
    "box_lid": "Box",
    "laptop": "Laptop",
    "trash_can": "TrashCan",
    "oven": "Oven",
    "table_drawer": "Table",
    "washing_machine": "WashingMachine",
    "toilet": "Toilet",
}
FIRST_ID = 900_000
BASE_RPY = "1.570796326794897 0 -1.570796326794897"
CYLINDER_SEGMENTS = 16
JOINT_WORDS = {"revolute": "hinge", "prismatic": "slider"}


def to_mesh(points: np.ndarray) -> np.ndarray:
    """Object frame (z up, front towards -x) -> PartNet's mesh frame (y up, front towards +z); the base
    joint's rpy (pi/2, 0, -pi/2) maps it back."""
    p = np.asarray(points, dtype=np.float64)
    return np.stack([-p[..., 1], p[..., 2], -p[..., 0]], axis=-1)


def _triangles(local: np.ndarray, faces: list[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """Fan-triangulate convex polygons, each turned to face away from the solid's centre."""
    centre = local.mean(0)
    out = []
    for face in faces:
        for a, b, c in ((face[0], face[i], face[i + 1]) for i in range(1, len(face) - 1)):
            normal = np.cross(local[b] - local[a], local[c] - local[a])
            out.append((a, b, c) if normal @ (local[a] - centre) > 0 else (a, c, b))
    return out


def shape_mesh(shape: Shape) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Vertices (object frame) and outward triangles of a box or a cylinder (a 16-sided prism)."""
    if shape.kind == "box":
        local = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], float) * shape.size
        faces = [(0, 1, 3, 2), (4, 5, 7, 6), (0, 1, 5, 4), (2, 3, 7, 6), (0, 2, 6, 4), (1, 3, 7, 5)]
    else:
        radius, half = shape.size[0], shape.size[1]
        angles = 2 * math.pi * np.arange(CYLINDER_SEGMENTS) / CYLINDER_SEGMENTS
        ring = np.stack([np.cos(angles), np.sin(angles)], axis=1) * radius
        local = np.concatenate([np.c_[np.full(len(ring), x), ring] for x in (-half, half)])
        n = CYLINDER_SEGMENTS
        faces = [tuple(range(n)), tuple(range(n, 2 * n))]
        faces += [(i, (i + 1) % n, n + (i + 1) % n, n + i) for i in range(n)]
    return local @ quat_to_matrix(shape.quat).T + np.array(shape.pos), _triangles(local, faces)


def _write_obj(path: Path, pieces: list[Shape], shift: np.ndarray) -> None:
    """One OBJ (+ MTL) holding ``pieces`` as separate objects, in mesh coordinates minus ``shift``."""
    lines = [f"mtllib {path.with_suffix('.mtl').name}"]
    materials = []
    offset = 1
    for k, shape in enumerate(pieces):
        vertices, triangles = shape_mesh(shape)
        lines += [f"o {shape.label}_{k}", f"usemtl m{k}"]
        lines += [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in to_mesh(vertices) - shift]
        lines += [f"f {a + offset} {b + offset} {c + offset}" for a, b, c in triangles]
        offset += len(vertices)
        materials += [f"newmtl m{k}", "Kd {:.4f} {:.4f} {:.4f}".format(*shape.colour), "Ka 0 0 0", ""]
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".mtl").write_text("\n".join(materials))


def _link_files(link: Link) -> list[list[Shape]]:
    """A link's mesh files: one per shape, except that all its handle pieces share one file."""
    handle = [s for s in link.shapes if s.label == "handle"]
    return [[s] for s in link.shapes if s.label != "handle"] + ([handle] if handle else [])


def _xyz(v) -> str:
    return " ".join(f"{float(x) + 0.0:.9g}" for x in v)  # + 0.0 writes -0 as 0


def write_asset(obj: ArticulatedObject, folder: str | Path, asset_id: str, category: str) -> Path:
    """Write ``obj`` (centred on the origin) as a PartNet-Mobility folder; returns the folder."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "textured_objs").mkdir(parents=True)
    lo, hi = obj.bounds()
    centre = (lo + hi) / 2
    movable, body = obj.movable, obj.links[0]
    names = {link.name: f"link_{i}" for i, link in enumerate(movable)} | {body.name: f"link_{len(movable)}"}
    urdf = [
        '<?xml version="1.0" ?>',
        f'<robot name="vlm_grpoma_{obj.category}_{obj.seed}">',
        '\t<link name="base"/>',
    ]
    semantics, tree, file_number = [], [], 0
    for link in (*movable, body):
        name = names[link.name]
        origin = to_mesh(np.array(link.joint.origin) - centre) if link.joint else np.zeros(3)
        urdf.append(f'\t<link name="{name}">')
        parts = []
        for pieces in _link_files(link):
            file_number += 1
            mesh = f"textured_objs/original-{file_number}.obj"
            _write_obj(folder / mesh, pieces, to_mesh(centre))
            parts.append({"id": file_number, "name": pieces[0].label, "children": []})
            for tag in ("visual", "collision"):
                label = f' name="{pieces[0].label}-{file_number}"' if tag == "visual" else ""
                urdf += [
                    f"\t\t<{tag}{label}>",
                    f'\t\t\t<origin xyz="{_xyz(-origin)}"/>',
                    f'\t\t\t<geometry><mesh filename="{mesh}"/></geometry>',
                    f"\t\t</{tag}>",
                ]
        urdf.append("\t</link>")
        if link.joint is None:
            urdf += [
                f'\t<joint name="joint_{len(movable)}" type="fixed">',
                f'\t\t<origin rpy="{BASE_RPY}" xyz="0 0 0"/>',
                f'\t\t<child link="{name}"/>\n\t\t<parent link="base"/>\n\t</joint>',
            ]
            semantics.append(f"{name} free body")
            tree.append(
                {
                    "id": len(movable),
                    "parent": -1,
                    "joint": "free",
                    "name": "body",
                    "parts": parts,
                    "jointData": {},
                }
            )
            continue
        j = link.joint
        axis = to_mesh(np.array(j.axis))
        urdf += [
            f'\t<joint name="joint_{name[5:]}" type="{j.type}">',
            f'\t\t<origin xyz="{_xyz(origin)}"/>\n\t\t<axis xyz="{_xyz(axis)}"/>',
            f'\t\t<child link="{name}"/>\n\t\t<parent link="{names[body.name]}"/>',
            f'\t\t<limit lower="{j.limits[0]:.9g}" upper="{j.limits[1]:.9g}"/>\n\t</joint>',
        ]
        semantics.append(f"{name} {JOINT_WORDS[j.type]} {link.label}")
        degrees = 180 / math.pi if j.type == "revolute" else 1.0
        tree.append(
            {
                "id": int(name[5:]),
                "parent": len(movable),
                "joint": JOINT_WORDS[j.type],
                "name": link.label,
                "parts": parts,
                "jointData": {
                    "axis": {"origin": origin.tolist(), "direction": axis.tolist()},
                    "limit": {"a": j.limits[0] * degrees, "b": j.limits[1] * degrees, "noLimit": False},
                },
            }
        )
    urdf.append("</robot>")
    (folder / URDF_NAME).write_text("\n".join(urdf) + "\n")
    (folder / SEMANTICS_NAME).write_text("\n".join(semantics) + "\n")
    (folder / MOBILITY_NAME).write_text(json.dumps(sorted(tree, key=lambda p: p["id"])))
    meta = {
        "model_cat": category,
        "anno_id": asset_id,
        "model_id": f"vlm-grpoma-{obj.category}-{obj.seed}",
        "version": "3",
        "source": "vlm-grpoma procedural generator",
    }
    (folder / META_NAME).write_text(json.dumps(meta))
    return folder


def _ids(split: CategorySplit, start: int, count: int) -> list[int]:
    """``count`` ids from ``start`` on, a fifth of them (at least one) test instances of ``split``."""
    tests = max(1, round(count * split.test_fraction)) if count > 1 else 0
    picked = {True: [], False: []}
    candidate = start
    while len(picked[True]) < tests or len(picked[False]) < count - tests:
        is_test = split.is_test_instance(str(candidate))
        if len(picked[is_test]) < (tests if is_test else count - tests):
            picked[is_test].append(candidate)
        candidate += 1
    return sorted(picked[True] + picked[False])


def generate_assets(
    root: str | Path, per_category: int, seed: int = 0, categories: tuple[str, ...] | None = None
) -> list[Path]:
    """Write ``per_category`` objects of each procedural category (default: all of PARTNET_CATEGORIES)."""
    split = load_split()
    folders = []
    for number, category in enumerate(categories or tuple(PARTNET_CATEGORIES)):
        if category not in PARTNET_CATEGORIES:
            raise CommandError(f"unknown category {category!r}; choose from {', '.join(PARTNET_CATEGORIES)}")
        for asset_id in _ids(split, FIRST_ID + 1000 * number, per_category):
            obj = make_object(category, seed * 1_000_003 + asset_id)
            folders.append(
                write_asset(obj, Path(root) / str(asset_id), str(asset_id), PARTNET_CATEGORIES[category])
            )
    return folders


def main(args: argparse.Namespace) -> int:
    if args.per_category <= 0:
        raise CommandError(f"--per-category must be positive, got {args.per_category}")
    out = writable_folder(Path(args.out), "--out")
    folders = generate_assets(
        out, args.per_category, args.seed, tuple(args.categories) if args.categories else None
    )
    split = load_split()
    counts: dict[str, int] = {}
    for folder in folders:
        category = json.loads((folder / META_NAME).read_text())["model_cat"]
        key = f"{category} ({split.split_of(folder.name, category)})"
        counts[key] = counts.get(key, 0) + 1
    print(f"wrote {len(folders)} PartNet-Mobility-format objects to {out}")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0
