"""SAPIEN-grounded datasets: rendered articulated objects as manipulation, affordance, trajectory and
detection records (``vlm-grpoma make-data --source sapien``).

Every record comes from one sampled episode (object instance, camera, target part; see
``vlm_grpoma.envs.sapien.task``) and carries its spec in ``meta`` (with its execution protocol) so it can be
re-simulated: the ``manipulation`` reward then executes answers under the protocol the record was made with.
Objects are procedural by default (``simple`` protocol) or PartNet-Mobility folders (``assets``, split by
category with a split file; ``manipllm`` protocol by default). Splits: ``train`` (seen categories, training
instances), ``seen`` (seen categories, held-out instances) and ``unseen`` (held-out categories). Ground
truth, in original-image pixels:

- manipulation: the oracle ContactAction (procedural: contact on the target part, pull direction from the
  joint; ``manipllm``: ManipLLM's successful demonstration);
- affordance: ``masks/<id>.png``, the target part's handle (or the part itself when its handle shows
  fewer than ``MIN_MASK_PIXELS``);
- trajectory: the oracle contact point's projected path as the joint opens (to its limit or the image
  border, ``TRAJECTORY_POINTS`` points);
- detection: boxes of the visible movable parts, labelled by part (door, drawer, lid, screen).
With ``views`` (``--views front,wrist``, :mod:`~vlm_grpoma.envs.sapien.views`) each record shows every view,
front first and the target: ``images/<id>.png`` and ``images/<id>-<view>.png``; ``meta.views`` names them.
Images need a renderer: without one this fails with the reason instead of writing blank images.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from vlm_grpoma.answers import Box, Boxes, ContactAction, Trajectory
from vlm_grpoma.datasets.schema import TASKS, MaskRef, Record, record_to_json, with_images
from vlm_grpoma.envs.sapien.camera import CameraSpec, handle_shape_ids, raycast
from vlm_grpoma.envs.sapien.manipllm import sample_asset
from vlm_grpoma.envs.sapien.objects import DISPLAY_NAMES, joint_transform
from vlm_grpoma.envs.sapien.partnet import display_name, scan_assets
from vlm_grpoma.envs.sapien.scene import BuiltScene
from vlm_grpoma.envs.sapien.splits import load_split, no_objects_message, round_robin
from vlm_grpoma.envs.sapien.task import EpisodeSpec, render_episode, render_view, sample_split_episode
from vlm_grpoma.envs.sapien.views import view_camera
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.errors import CommandError

IMAGE_SIZE = 336
MIN_MASK_PIXELS = 20
TRAJECTORY_POINTS = 8
SPLITS = ("train", "seen", "unseen")


def _episodes(n: int, seed: int, split: str, assets, split_file, protocol: str) -> Iterator:
    """(spec, oracle) pairs: procedural episodes of the split, or episodes on the split's asset objects (an
    object with no successful ManipLLM demonstration is skipped, as ManipLLM drops it). Checks the inputs
    before anything is sampled."""
    if assets is None:
        if protocol != "simple" or split_file is not None:
            raise CommandError(
                f"--protocol {protocol} and --split-file apply to PartNet-Mobility objects: give --assets DIR"
            )
        return (sample_split_episode(split, i, seed, width=IMAGE_SIZE, height=IMAGE_SIZE) for i in range(n))
    split_def = load_split(split_file)
    objects = scan_assets(assets)
    chosen = round_robin(objects, split_def, split, n)
    if not chosen:
        raise CommandError(no_objects_message(objects, split_def, split, f"--assets {assets}"))

    def sampled() -> Iterator:
        for index, asset in enumerate(chosen):
            try:
                yield sample_asset(asset, seed * 1_000_003 + index, protocol)
            except RuntimeError:
                continue

    return sampled()


def generate(
    task: str,
    n: int,
    out_dir: Path,
    seed: int,
    split: str,
    assets: str | Path | None = None,
    split_file: str | Path | None = None,
    protocol: str | None = None,
    views: tuple[str, ...] = ("front",),
) -> Path:
    """Write up to ``n`` records of ``task`` to ``out_dir/records.jsonl`` (+ images/, masks/); returns the
    path. ``assets``: PartNet-Mobility folders instead of procedural objects; ``views``: the cameras each
    record shows."""
    protocol = protocol or ("manipllm" if assets is not None else "simple")
    if task not in TASKS:
        raise CommandError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if split not in SPLITS:
        raise CommandError(
            f"--split {split!r} is not a SAPIEN split; choose train (seen categories, training "
            "instances), seen (held-out instances) or unseen (held-out categories)"
        )
    episodes = _episodes(n, seed, split, assets, split_file, protocol)
    ok, reason = rendering_status(in_process=True)
    if not ok:
        raise CommandError(f"SAPIEN records need rendered images but rendering is unavailable: {reason}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "records.jsonl"
    with path.open("w") as f:
        for index, (spec, oracle) in enumerate(episodes):
            record = render_record(
                task, f"sapien-{task}-{split}-{seed}-{index:06d}", split, spec, oracle, out_dir, views
            )
            f.write(json.dumps(record_to_json(record)) + "\n")
    return path


def render_record(
    task: str,
    record_id: str,
    split: str,
    spec: EpisodeSpec,
    oracle: ContactAction,
    out_dir: Path,
    views: tuple[str, ...] = ("front",),
) -> Record:
    """Render one episode to ``out_dir/images/<record_id>.png`` (and ``<record_id>-<view>.png`` for each
    further view) and build its ``task`` record, the front view its target."""
    built, front = render_episode(spec)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    images = []
    for name in views:
        rgb = front.rgb
        if name != "front":
            rgb = render_view(built, spec, view_camera(name, spec.camera)).rgb
        images.append(f"images/{record_id}.png" if name == "front" else f"images/{record_id}-{name}.png")
        Image.fromarray(rgb).save(out_dir / images[-1])
    record = _RECORD_MAKERS[task](record_id, images[0], split, spec, oracle, built, front, out_dir)
    if len(views) == 1:
        return record
    return with_images(replace(record, meta=record.meta | {"views": list(views)}), tuple(images))


def _name(spec: EpisodeSpec) -> str:
    return DISPLAY_NAMES.get(spec.category) or display_name(spec.category)


def _part(spec: EpisodeSpec) -> str:
    """The target part as a person names it (PartNet-Mobility labels such as ``rotation_door``)."""
    return spec.target_label.replace("_", " ")


def _manipulation(record_id, image, split, spec, oracle, built, views, out_dir) -> Record:
    prompt = (
        f"open the {_name(spec)} by pulling its {_part(spec)}; give the contact pixel and the "
        "gripper's up and forward directions in the camera frame (x forward, y left, z up)"
    )
    return _record(record_id, image, "manipulation", prompt, split, oracle, spec)


def _affordance(record_id, image, split, spec, oracle, built, views, out_dir) -> Record:
    mask = views.mask(spec.target_link)
    handle = mask & np.isin(views.shape_ids, list(handle_shape_ids(built, spec.target_link)))
    what = _part(spec)
    if handle.sum() >= MIN_MASK_PIXELS:
        mask, what = handle, f"{_part(spec)} handle"
    rel = f"masks/{record_id}.png"
    (out_dir / "masks").mkdir(exist_ok=True)
    Image.fromarray(mask.astype(np.uint8) * 255).save(out_dir / rel)
    prompt = f"grasp the {what} of the {_name(spec)} to open it"
    return _record(record_id, image, "affordance", prompt, split, MaskRef(rel), spec, {"region": what})


def _trajectory(record_id, image, split, spec, oracle, built, views, out_dir) -> Record:
    path = contact_path(built, spec.camera, spec, oracle)
    prompt = (
        f"pull the {_part(spec)} of the {_name(spec)} open from its grasp point; draw the grasp point's path"
    )
    return _record(record_id, image, "trajectory", prompt, split, Trajectory(path), spec)


def _detection(record_id, image, split, spec, oracle, built, views, out_dir) -> Record:
    boxes = []
    for link in built.obj.movable:
        ys, xs = np.nonzero(views.mask(link.name))
        if len(xs) >= MIN_MASK_PIXELS:
            boxes.append(
                Box(float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1), link.label)
            )
    prompt = f"every movable part of the {_name(spec)} (door, drawer, lid or screen)"
    return _record(record_id, image, "detection", prompt, split, Boxes(tuple(boxes)), spec)


def contact_path(built: BuiltScene, camera: CameraSpec, spec: EpisodeSpec, oracle: ContactAction) -> tuple:
    """Pixels of the oracle contact point as the target joint opens from its initial position to its upper
    limit, or until the point would leave the image, at ``TRAJECTORY_POINTS`` evenly spaced joint values."""
    hit = raycast(built, camera, *oracle.point)
    link = built.obj.link(spec.target_link)
    q0 = spec.initial_qpos.get(link.name, 0.0)
    rot0, trans0 = joint_transform(link.joint, q0)
    rest = rot0.T @ (hit.point - trans0)  # the point on the part at joint position 0

    def pixels(qs: np.ndarray) -> np.ndarray:
        points = []
        for q in qs:
            rot, trans = joint_transform(link.joint, float(q))
            points.append(rot @ rest + trans)
        return camera.project(np.array(points))

    dense = np.linspace(q0, link.joint.limits[1], 8 * TRAJECTORY_POINTS)
    px = pixels(dense)
    inside = (px[:, 0] >= 0) & (px[:, 0] <= camera.width) & (px[:, 1] >= 0) & (px[:, 1] <= camera.height)
    last = int(np.argmin(inside)) - 1 if not inside.all() else len(dense) - 1
    path = pixels(np.linspace(q0, dense[max(last, 1)], TRAJECTORY_POINTS))
    return tuple((float(x), float(y)) for x, y in path)


def _record(
    record_id, image, task, prompt, split, gt, spec: EpisodeSpec, extra: dict | None = None
) -> Record:
    return Record(
        record_id,
        image,
        task,
        prompt,
        spec.camera.width,
        spec.camera.height,
        gt,
        split,
        spec.to_meta() | (extra or {}),
    )


_RECORD_MAKERS = {
    "manipulation": _manipulation,
    "affordance": _affordance,
    "trajectory": _trajectory,
    "detection": _detection,
}
