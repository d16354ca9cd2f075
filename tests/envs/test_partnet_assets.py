"""PartNet-Mobility folders: the generator's output matches the procedural objects, a hand-written asset with
the real files' quirks loads and runs, malformed folders fail naming the file, and the split file."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from vlm_grpoma.envs.sapien.camera import CameraSpec, raycast, raycast_image
from vlm_grpoma.envs.sapien.manipllm import sample_asset_episode
from vlm_grpoma.envs.sapien.objects import make_object
from vlm_grpoma.envs.sapien.partnet import display_name, read_asset, scan_assets
from vlm_grpoma.envs.sapien.partnet_export import PARTNET_CATEGORIES, write_asset
from vlm_grpoma.envs.sapien.protocol import MANIPLLM
from vlm_grpoma.envs.sapien.scene import build_scene, build_urdf_scene
from vlm_grpoma.envs.sapien.splits import load_split, parse_split
from vlm_grpoma.envs.sapien.task import execute
from vlm_grpoma.envs.sapien.urdf import prepare_urdf
from vlm_grpoma.errors import DataError, MissingDependencyError

REPO = Path(__file__).resolve().parents[2]


def _half_open(built) -> None:
    built.set_qpos({link.name: 0.5 * link.joint.limits[1] for link in built.obj.movable})
    built.scene.step()


@pytest.mark.parametrize(
    "category,tolerance",
    # a round body is a 16-sided prism in the OBJ file, PhysX's own cylinder in the direct build
    [
        ("drawer_cabinet", 1e-4),
        ("refrigerator", 1e-4),
        ("laptop", 1e-4),
        ("trash_can", 5e-3),
        ("toilet", 1e-4),
    ],
)
def test_generated_asset_matches_the_procedural_object(tmp_path, category, tolerance):
    obj = make_object(category, 7)
    lo, hi = obj.bounds()
    centre = (lo + hi) / 2
    asset = read_asset(write_asset(obj, tmp_path / "900123", "900123", PARTNET_CATEGORIES[category]))
    assert asset.category == PARTNET_CATEGORIES[category] and asset.asset_id == "900123"
    direct, loaded = build_scene(obj), build_urdf_scene(asset.urdf)
    parts = {link.name: f"link_{i}" for i, link in enumerate(obj.movable)}
    assert {loaded.obj.link(parts[link.name]).label for link in obj.movable} == {
        part.label for part in obj.movable
    }
    for link in obj.movable:  # same joints, in the world frame (the asset is centred on the origin)
        ours = loaded.obj.link(parts[link.name]).joint
        assert ours.type == link.joint.type and np.allclose(ours.limits, link.joint.limits, atol=1e-6)
        assert np.allclose(ours.axis, link.joint.axis, atol=1e-5)
        offset = np.subtract(ours.origin, np.array(link.joint.origin) - centre)
        assert np.linalg.norm(np.cross(offset, link.joint.axis)) < 1e-5  # the same axis line
    _half_open(direct)
    _half_open(loaded)
    # the same geometry, half open, seen through the same camera (depth and part maps of raycasts)
    camera = CameraSpec((-2.5, -1.0, 1.2), (0.0, 0.0, 0.0), 96, 96)
    shifted = replace(camera, position=tuple(np.add(camera.position, centre)), target=tuple(centre))
    depth_a, parts_a = raycast_image(direct, shifted, stride=2)
    depth_b, parts_b = raycast_image(loaded, camera, stride=2)
    assert ((parts_a >= 0) == (parts_b >= 0)).mean() > 0.99
    both = np.isfinite(depth_a) & np.isfinite(depth_b)
    assert both.sum() > 100 and np.median(np.abs(depth_a[both] - depth_b[both])) < tolerance


def test_generated_folder_has_partnet_files(generated_assets):
    microwave = next(a for a in generated_assets if a.category == "Microwave")
    text = microwave.urdf.read_text()
    assert 'rpy="1.570796326794897 0 -1.570796326794897"' in text and '<link name="base"/>' in text
    assert text.count("<visual") >= 3 and text.count("<visual") == text.count("<collision")
    lines = (microwave.folder / "semantics.txt").read_text().split("\n")
    assert lines[0] == "link_0 hinge door" and lines[1] == "link_1 free body"
    tree = json.loads((microwave.folder / "mobility_v2.json").read_text())
    assert [p["joint"] for p in tree] == ["hinge", "free"] and tree[0]["jointData"]["limit"]["b"] > 80
    assert json.loads((microwave.folder / "meta.json").read_text())["model_cat"] == "Microwave"
    handles = [p for p in microwave.folder.glob("textured_objs/*.obj") if "o handle" in p.read_text()]
    assert handles and all(p.with_suffix(".mtl").is_file() for p in handles)
    split = load_split()
    seen = {a.category for a in generated_assets if split.split_of(a.asset_id, a.category) == "seen"}
    unseen = {a.category for a in generated_assets if split.split_of(a.asset_id, a.category) == "unseen"}
    assert seen == {"StorageFurniture", "Safe", "Refrigerator", "Microwave", "Box", "Laptop", "TrashCan"}
    assert unseen == {"Oven", "Table", "WashingMachine", "Toilet"}
    assert display_name("StorageFurniture") == "storage furniture" and display_name("USB") == "usb"


# A hand-written object in PartNet-Mobility's frame (y up, z towards the front) with the quirks of the real
# files: child links framed at their joint origin (meshes offset back), several visual meshes per link, a
# handle on a fixed joint with visuals but no collision, a door mimicking the other, a mesh scale attribute
# (the body mesh is written at twice its size) and a joint type the loader must map (continuous).
QUIRKY_URDF = """<?xml version="1.0" ?>
<robot name="quirky">
  <link name="base"/>
  <link name="link_3">
    <visual name="body-1"><origin xyz="0 0 0"/><geometry><mesh filename="textured_objs/body.obj" scale="0.5 0.5 0.5"/></geometry></visual>
    <visual name="plinth-2"><origin xyz="0 0 0"/><geometry><mesh filename="textured_objs/plinth.obj"/></geometry></visual>
    <collision><origin xyz="0 0 0"/><geometry><mesh filename="textured_objs/body.obj" scale="0.5 0.5 0.5"/></geometry></collision>
  </link>
  <joint name="joint_3" type="fixed">
    <origin rpy="1.570796326794897 0 -1.570796326794897" xyz="0 0 0"/><child link="link_3"/><parent link="base"/>
  </joint>
  <link name="link_0">
    <visual name="door-3"><origin xyz="0.29 0 -0.26"/><geometry><mesh filename="textured_objs/left.obj"/></geometry></visual>
    <collision><origin xyz="0.29 0 -0.26"/><geometry><mesh filename="textured_objs/left.obj"/></geometry></collision>
  </link>
  <joint name="joint_0" type="revolute">
    <origin xyz="-0.29 0 0.26"/><axis xyz="0 -1 0"/><child link="link_0"/><parent link="link_3"/>
    <limit lower="0" upper="1.5707963"/>
  </joint>
  <link name="link_0_handle">
    <visual name="handle-4"><origin xyz="0.29 0 -0.26"/><geometry><mesh filename="textured_objs/handle.obj"/></geometry></visual>
  </link>
  <joint name="joint_4" type="fixed"><origin xyz="0 0 0"/><child link="link_0_handle"/><parent link="link_0"/></joint>
  <link name="link_1">
    <visual name="door-5"><origin xyz="-0.29 0 -0.26"/><geometry><mesh filename="textured_objs/right.obj"/></geometry></visual>
    <collision><origin xyz="-0.29 0 -0.26"/><geometry><mesh filename="textured_objs/right.obj"/></geometry></collision>
  </link>
  <joint name="joint_1" type="revolute">
    <origin xyz="0.29 0 0.26"/><axis xyz="0 1 0"/><child link="link_1"/><parent link="link_3"/>
    <limit lower="0" upper="1.5707963"/><mimic joint="joint_0" multiplier="1" offset="0"/>
  </joint>
  <link name="link_2">
    <visual name="knob-6"><origin xyz="0 -0.3 -0.26"/><geometry><mesh filename="textured_objs/knob.obj"/></geometry></visual>
    <collision><origin xyz="0 -0.3 -0.26"/><geometry><mesh filename="textured_objs/knob.obj"/></geometry></collision>
  </link>
  <joint name="joint_2" type="continuous">
    <origin xyz="0 0.3 0.26"/><axis xyz="0 0 1"/><child link="link_2"/><parent link="link_3"/>
  </joint>
</robot>
"""
QUIRKY_BOXES = {  # mesh-frame boxes (lo, hi) written as OBJ files
    "body.obj": ((-0.6, -0.8, -0.5), (0.6, 0.8, 0.5)),  # twice the size: the URDF scales it by 0.5
    "plinth.obj": ((-0.3, -0.42, -0.25), (0.3, -0.4, 0.25)),
    "left.obj": ((-0.29, -0.35, 0.25), (-0.005, 0.25, 0.27)),
    "right.obj": ((0.005, -0.35, 0.25), (0.29, 0.25, 0.27)),
    "handle.obj": ((-0.06, -0.1, 0.27), (-0.04, 0.1, 0.3)),
    "knob.obj": ((-0.03, 0.27, 0.25), (0.03, 0.33, 0.28)),
}


def _box_obj(lo, hi) -> str:
    corners = [(x, y, z) for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
    faces = [(1, 2, 4, 3), (5, 7, 8, 6), (1, 5, 6, 2), (3, 4, 8, 7), (1, 3, 7, 5), (2, 6, 8, 4)]
    return "".join(f"v {x} {y} {z}\n" for x, y, z in corners) + "".join(
        f"f {a} {b} {c}\nf {a} {c} {d}\n" for a, b, c, d in faces
    )


@pytest.fixture()
def quirky(tmp_path) -> Path:
    folder = tmp_path / "7167"
    (folder / "textured_objs").mkdir(parents=True)
    (folder / "mobility.urdf").write_text(QUIRKY_URDF)
    for name, (lo, hi) in QUIRKY_BOXES.items():
        (folder / "textured_objs" / name).write_text(_box_obj(lo, hi))
    (folder / "meta.json").write_text(json.dumps({"model_cat": "StorageFurniture", "anno_id": "7167"}))
    (folder / "semantics.txt").write_text(
        "link_0 hinge rotation_door\nlink_1 hinge rotation_door\nlink_2 hinge knob\nlink_3 heavy furniture_body\n"
    )
    (folder / "mobility_v2.json").write_text(json.dumps([{"id": i, "joint": "hinge"} for i in range(3)]))
    return folder


def test_quirky_asset_loads_with_its_quirks(quirky):
    asset = read_asset(quirky)
    assert asset.labels["link_0"] == "rotation_door" and asset.category == "StorageFurniture"
    scale = 0.8
    built = build_urdf_scene(asset.urdf, scale=scale, protocol=MANIPLLM)
    built.scene.step()
    # body: mesh x in [-0.3, 0.3] -> world y, mesh y in [-0.4, 0.4] (+ plinth, visual only) -> world z,
    # mesh z in [-0.25, 0.25] -> world -x; the doors stand 0.25..0.27 in front; all scaled by 0.8
    lo, hi = built.bounds("base")
    assert np.allclose(lo, np.array([-0.25, -0.3, -0.4]) * scale, atol=2e-3)
    assert np.allclose(hi, np.array([0.25, 0.3, 0.4]) * scale, atol=2e-3)
    assert (
        built.owner["link_0_handle"] == "link_0" and built.link_components["link_0_handle"].collision_shapes
    )
    assert set(built.joint_index) == {"link_0", "link_1", "link_2"}
    doors = {name: built.obj.link(name).joint for name in ("link_0", "link_1")}
    assert np.allclose(doors["link_0"].axis, [0, 0, -1], atol=1e-6) and np.allclose(
        doors["link_1"].axis, [0, 0, 1], atol=1e-6
    )
    assert np.allclose(doors["link_0"].origin, np.array([-0.26, 0.29, 0.0]) * scale, atol=1e-6)
    assert built.obj.link("link_2").joint.limits[1] == math.inf  # continuous
    for joint in built.articulation.get_active_joints():  # ManipLLM's joint physics
        assert joint.damping == pytest.approx(10.0) and joint.friction == 0.0
    # the handle (visual only in the file) can be hit, and it belongs to the door
    handle = np.array([-0.285, 0.05, 0.0]) * scale
    camera = CameraSpec(tuple(handle + [-3.0, 0.0, 0.3]), tuple(handle), 64, 64)
    hit = raycast(built, camera, 32.0, 32.0)
    assert hit is not None and hit.link == "link_0" and hit.point[0] < -0.27 * scale
    # the mimic joint: driving the left door open takes the right one with it
    left, right = (built.articulation.get_active_joints()[built.joint_index[n]] for n in ("link_0", "link_1"))
    left.set_drive_property(2000.0, 100.0)
    left.set_drive_target(0.6)
    for _ in range(400):
        built.scene.step()
    q = built.qpos()
    assert q[built.joint_index["link_0"]] > 0.4
    assert q[built.joint_index["link_1"]] == pytest.approx(q[built.joint_index["link_0"]], abs=0.05)


def test_quirky_asset_runs_manipllm_episodes(quirky):
    outcomes = [execute(*sample_asset_episode(quirky, episode)) for episode in range(3)]
    assert all(o.success for o in outcomes)


def test_prepare_urdf_gives_visual_only_links_collisions_and_absolute_paths(quirky):
    text = prepare_urdf(QUIRKY_URDF, render=True, path=quirky / "mobility.urdf")
    assert text.count("<collision") == QUIRKY_URDF.count("<collision") + 1  # the handle's visual
    assert f'filename="{quirky / "textured_objs" / "handle.obj"}"' in text
    physics = prepare_urdf(QUIRKY_URDF, render=False, path=quirky / "mobility.urdf")
    assert "<visual" not in physics and physics.count("<collision") == text.count("<collision")


def test_collision_modes(generated_assets):
    from vlm_grpoma.envs.sapien.urdf import load_articulation
    from vlm_grpoma.envs.sapien.vulkan import import_sapien

    sapien = import_sapien()
    refrigerator = next(a for a in generated_assets if a.category == "Refrigerator")
    shapes = {}
    for mode in ("convex", "pieces"):
        scene = sapien.Scene([sapien.physx.PhysxCpuSystem()])
        articulation = load_articulation(scene, refrigerator.urdf, render=False, collision=mode)
        shapes[mode] = sum(len(link.collision_shapes) for link in articulation.get_links())
    assert shapes["pieces"] > shapes["convex"]  # a bar handle's file holds three pieces
    if __import__("importlib").util.find_spec("coacd") is None:
        with pytest.raises(MissingDependencyError, match="coacd"):
            load_articulation(scene, refrigerator.urdf, render=False, collision="coacd")
    with pytest.raises(ValueError, match="collision mode"):
        load_articulation(scene, refrigerator.urdf, render=False, collision="hull")


def _break(folder: Path, how: str) -> str:
    """Damage a valid asset folder; returns the file name the error must name."""
    urdf = folder / "mobility.urdf"
    if how == "no_meta":
        (folder / "meta.json").unlink()
        return "meta.json"
    if how == "meta_without_category":
        (folder / "meta.json").write_text('{"anno_id": "1"}')
        return "meta.json"
    if how == "meta_not_json":
        (folder / "meta.json").write_text("{model_cat: Box")
        return "meta.json"
    if how == "semantics_short_line":
        (folder / "semantics.txt").write_text("link_0 hinge door\nlink_1 free\n")
        return "semantics.txt:2"
    if how == "semantics_unknown_link":
        (folder / "semantics.txt").write_text("link_7 hinge door\n")
        return "semantics.txt:1"
    if how == "missing_mesh":
        next(folder.glob("textured_objs/*.obj")).unlink()
        return "mobility.urdf"
    if how == "urdf_not_xml":
        urdf.write_text(urdf.read_text()[:-20])
        return "mobility.urdf"
    if how == "bad_limit":  # as in a real PartNet-Mobility file (object 3763)
        urdf.write_text(urdf.read_text().replace('upper="', 'upper="-z', 1))
        return "mobility.urdf"
    if how == "unknown_joint":
        urdf.write_text(urdf.read_text().replace('type="revolute"', 'type="hinge"', 1))
        return "mobility.urdf"
    if how == "semantics_not_utf8":
        (folder / "semantics.txt").write_bytes(b"link_0 hinge d\xf6or\n")
        return "semantics.txt: not UTF-8 text"
    if how == "mesh_not_a_mesh":
        (folder / "textured_objs" / "original-1.obj").write_text("garbage\n")
        return "link 'link_0' uses mesh 'textured_objs/original-1.obj', which is an OBJ with 0 vertices"
    if how == "mesh_unreadable":
        (folder / "textured_objs" / "original-1.obj").write_bytes(b"")
        return "uses mesh 'textured_objs/original-1.obj', which is empty"
    if how == "mobility_not_list":
        (folder / "mobility_v2.json").write_text('{"joint": "hinge"}')
        return "mobility_v2.json"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "no_meta",
        "meta_without_category",
        "meta_not_json",
        "semantics_short_line",
        "semantics_unknown_link",
        "missing_mesh",
        "urdf_not_xml",
        "bad_limit",
        "unknown_joint",
        "semantics_not_utf8",
        "mesh_not_a_mesh",
        "mesh_unreadable",
        "mobility_not_list",
    ],
)
def test_malformed_asset_names_the_file(generated_assets, tmp_path, how):
    microwave = next(a for a in generated_assets if a.category == "Microwave")
    folder = tmp_path / microwave.asset_id
    shutil.copytree(microwave.folder, folder)
    culprit = _break(folder, how)
    with pytest.raises(DataError, match=culprit.replace(".", r"\.")) as caught:
        scan_assets(tmp_path)
    assert str(folder) in str(caught.value) and "\n" not in str(caught.value)


_OPENED: list[str] = []
_AUDITING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _AUDITING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


@pytest.fixture
def opened_files():
    """Paths this process opens while the test runs (Python's ``open`` audit events)."""
    if not _AUDITING:
        sys.addaudithook(_audit)  # hooks cannot be removed: one for the session, on only inside this fixture
    _OPENED.clear()
    _AUDITING[:] = [True]
    yield _OPENED
    _AUDITING[:] = [False]


def _pointing_out(generated_assets, root: Path, name: str, outside: Path) -> Path:
    """A copy of a microwave under ``root`` whose first mesh is ``name`` (for ``link``: a symlink to
    ``outside``); returns its folder."""
    microwave = next(a for a in generated_assets if a.category == "Microwave")
    folder = root / microwave.asset_id
    shutil.copytree(microwave.folder, folder)
    if name == "link":
        (folder / "textured_objs" / "link.obj").symlink_to(outside)
        name = "textured_objs/link.obj"
    urdf = folder / "mobility.urdf"
    urdf.write_text(urdf.read_text().replace("textured_objs/original-1.obj", name))
    return folder


@pytest.mark.parametrize("how", ["../outside.obj", "absolute", "package://outside.obj", "link"])
def test_mesh_paths_out_of_the_asset_folder_are_refused_unread(generated_assets, tmp_path, opened_files, how):
    root = tmp_path / "assets"
    root.mkdir()
    outside = root / "outside.obj"  # a valid mesh: before, the check passed and the simulator read it
    shutil.copy(generated_assets[0].folder / "textured_objs" / "original-1.obj", outside)
    name = str(outside) if how == "absolute" else how
    folder = _pointing_out(generated_assets, root, name, outside)
    opened_files.clear()  # what the checks open, not the set-up
    with pytest.raises(DataError) as caught:
        scan_assets(root)
    shown = "textured_objs/link.obj" if how == "link" else name
    assert str(caught.value) == (
        f"{folder / 'mobility.urdf'}: mesh path {shown!r} leads out of the asset folder {folder.resolve()}"
    )
    with pytest.raises(DataError, match="leads out of the asset folder"):
        build_urdf_scene(folder / "mobility.urdf")
    assert str(outside.resolve()) not in opened_files and any(
        p.endswith("mobility.urdf") for p in opened_files
    )


@pytest.mark.timeout(60)  # the simulator opening the FIFO would block until this timeout
def test_the_simulator_never_opens_a_mesh_out_of_the_asset_folder(generated_assets, tmp_path):
    root = tmp_path / "assets"
    root.mkdir()
    os.mkfifo(root / "outside.obj")
    folder = _pointing_out(generated_assets, root, "../outside.obj", root / "outside.obj")
    with pytest.raises(DataError, match=r"mesh path '\.\./outside\.obj' leads out of the asset folder"):
        build_urdf_scene(folder / "mobility.urdf", render=False)


def test_a_link_whose_collision_mesh_does_not_cook_is_refused_at_load(generated_assets, tmp_path):
    """The up-front check reads meshes; loading without it (build_urdf_scene on a file) still refuses a link
    the physics engine built without shapes, instead of a door that cannot be touched."""
    microwave = next(a for a in generated_assets if a.category == "Microwave")
    folder = tmp_path / microwave.asset_id
    shutil.copytree(microwave.folder, folder)
    door = next(
        link for link in ET.parse(folder / "mobility.urdf").iter("link") if link.get("name") == "link_0"
    )
    for mesh in door.iter("mesh"):  # SAPIEN logs "OBJ-file is too small" and builds the door without shapes
        (folder / mesh.get("filename")).write_text("not a mesh\n")
    with pytest.raises(DataError) as caught:
        build_urdf_scene(folder / "mobility.urdf")
    assert str(caught.value).startswith(
        f"{folder / 'mobility.urdf'}: link(s) link_0 lost every collision shape"
    )


def test_empty_or_missing_asset_root(tmp_path):
    with pytest.raises(DataError, match="no object folders"):
        scan_assets(tmp_path)
    with pytest.raises(DataError, match="not a folder"):
        scan_assets(tmp_path / "nowhere")


def test_shipped_split_is_manipllms():
    split = load_split()
    assert split.name == "manipllm" and "184adfa7e245acf45a65f6a2a331ac36d85b4b78" in split.source
    assert len(split.seen) == 20 and len(split.unseen) == 7 and len(split.train_only) == 9
    assert split.unseen == ("Toilet", "Scissors", "Table", "USB", "WashingMachine", "Oven", "Faucet")
    assert set(split.test_only) == {"Stapler", "Phone", "Kettle", "Window"} and "Dishwasher" not in split.seen
    assert len(split.train_ids) == 1043 and len(split.test_ids) == 713
    # listed instances follow ManipLLM's files; others by hash, about test_fraction of them
    assert split.split_of("148", "StorageFurniture") == "seen" and split.split_of("3380", "Bottle") == "train"
    assert split.split_of("148", "Oven") == "unseen" and split.split_of("1", "Chair") is None
    hashed = [split.is_test_instance(str(i)) for i in range(2_000_000, 2_004_000)]
    assert abs(np.mean(hashed) - 0.2) < 0.02
    assert split.split_of("3380", "Cart") == "train" and split.split_of("148", "Cart") is None
    assert split.categories("train") == split.seen + split.train_only


def test_split_file_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["vlm_grpoma.envs.sapien"]
    assert any(Path("manipllm_split.json").match(p) for p in patterns)


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"unseen": ["Oven"]}', "'seen' must be a non-empty list"),
        ('{"seen": ["Box"], "unseen": ["Box"]}', "more than once: Box"),
        ('{"seen": ["Box"], "unseen": ["Oven"], "test_fraction": 2}', "test_fraction"),
        (
            '{"seen": ["Box"], "unseen": ["Oven"], "instances": {"train": [1], "test": [1]}}',
            "both train and test",
        ),
        ("[1, 2]", "expected a JSON object"),
        ("{seen", "not valid JSON"),
    ],
)
def test_bad_split_files(tmp_path, text, message):
    path = tmp_path / "split.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as caught:
        load_split(path)
    assert str(path) in str(caught.value)
    with pytest.raises(DataError, match="no such file"):
        load_split(tmp_path / "missing.json")
    custom = parse_split('{"seen": ["Oven"], "unseen": ["Box"], "test_fraction": 0}', "mine.json")
    assert custom.split_of("5", "Oven") == "train" and custom.split_of("5", "Box") == "unseen"


def test_make_assets_cli(tmp_path, capsys):
    from vlm_grpoma.cli import main as cli_main

    out = tmp_path / "assets"
    assert (
        cli_main(["make-assets", "--out", str(out), "--per-category", "5", "--categories", "oven", "laptop"])
        == 0
    )
    assets = scan_assets(out)
    assert [a.category for a in assets].count("Laptop") == 5 and len(assets) == 10
    split = load_split()
    # a fifth of the laptops
    assert sum(split.split_of(a.asset_id, a.category) == "seen" for a in assets) == 1
    assert "Laptop (seen): 1, Laptop (train): 4, Oven (unseen): 5" in capsys.readouterr().out
    assert cli_main(["make-assets", "--out", str(out), "--per-category", "0"]) == 1
    assert cli_main(["make-assets", "--out", str(out), "--categories", "teapot"]) == 1
    assert (
        cli_main(
            [
                "make-data",
                "--task",
                "detection",
                "--source",
                "shapes",
                "--n",
                "1",
                "--out",
                str(tmp_path / "d"),
                "--assets",
                str(out),
            ]
        )
        == 1
    )
