"""``make-data --source sapien``: rendered records for every task, consistent with the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.answers import Boxes, ContactAction, Trajectory
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import MaskRef
from vlm_grpoma.datasets.synthetic import sapien as sapien_data
from vlm_grpoma.envs.sapien.partnet import display_name
from vlm_grpoma.envs.sapien.task import EpisodeSpec, execute, render_episode, render_view
from vlm_grpoma.envs.sapien.views import parse_views, view_camera
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.errors import CommandError

N = 3


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    ok, reason = rendering_status(in_process=True)
    if not ok:
        pytest.skip(f"Vulkan rendering unavailable: {reason}")
    root = tmp_path_factory.mktemp("sapien-data")
    return {
        task: read_records(sapien_data.generate(task, N, root / task, 11, "unseen"))
        for task in ("manipulation", "affordance", "trajectory", "detection")
    }, root


@pytest.mark.slow
def test_records_are_grounded_in_the_same_scenes(datasets):
    records, root = datasets
    for i in range(N):
        manip = records["manipulation"][i]
        assert isinstance(manip.ground_truth, ContactAction) and manip.split == "unseen"
        spec = EpisodeSpec.from_meta(manip.meta)
        assert execute(spec, manip.ground_truth).success  # the ground truth really opens the object
        image = Image.open(root / "manipulation" / manip.image)
        assert image.size == (manip.width, manip.height)
        x, y = (int(v) for v in manip.ground_truth.point)

        afford = records["affordance"][i]
        assert isinstance(afford.ground_truth, MaskRef) and EpisodeSpec.from_meta(afford.meta) == spec
        mask = np.asarray(Image.open(root / "affordance" / afford.ground_truth.path))
        assert mask.shape == (manip.height, manip.width) and 20 <= (mask > 0).sum() < mask.size // 4
        near = mask[max(0, y - 2) : y + 3, max(0, x - 2) : x + 3]
        assert near.any()  # the oracle's contact lies on the target region

        traj = records["trajectory"][i].ground_truth
        assert isinstance(traj, Trajectory) and len(traj.points) == sapien_data.TRAJECTORY_POINTS
        assert np.allclose(traj.points[0], manip.ground_truth.point, atol=1e-3)
        assert np.linalg.norm(np.subtract(traj.points[-1], traj.points[0])) > 5

        boxes = records["detection"][i].ground_truth
        assert isinstance(boxes, Boxes) and boxes.boxes
        target = [b for b in boxes.boxes if b.x1 <= x <= b.x2 and b.y1 <= y <= b.y2]
        assert any(b.label == spec.target_label for b in target)


def test_bad_split_and_missing_renderer_are_clear(tmp_path, monkeypatch):
    with pytest.raises(CommandError, match="not a SAPIEN split"):
        sapien_data.generate("manipulation", 1, tmp_path, 0, "validation")
    monkeypatch.setattr(sapien_data, "rendering_status", lambda in_process: (False, "no Vulkan ICD here"))
    with pytest.raises(CommandError, match="no Vulkan ICD here"):
        sapien_data.generate("detection", 1, tmp_path, 0, "train")


@pytest.mark.slow
def test_asset_records_follow_manipllm(generated_assets, tmp_path):
    ok, reason = rendering_status(in_process=True)
    if not ok:
        pytest.skip(f"Vulkan rendering unavailable: {reason}")
    assets = generated_assets[0].folder.parent
    path = sapien_data.generate("manipulation", 2, tmp_path, 3, "unseen", assets=assets)
    records = read_records(path)
    assert len(records) == 2
    for record in records:
        spec = EpisodeSpec.from_meta(record.meta)
        assert spec.protocol == "manipllm" and spec.urdf.startswith(str(assets)) and record.split == "unseen"
        assert spec.category in {"Toilet", "Table", "WashingMachine", "Oven"}
        assert f"open the {display_name(spec.category)} by pulling its {spec.target_label}" in record.prompt
        image = np.asarray(Image.open(tmp_path / record.image))
        assert image[0, 0].tolist() == [255, 255, 255] and image.std() > 5  # white around the object
        assert execute(spec, record.ground_truth).success  # ManipLLM's demonstration, replayed


def test_asset_options_are_checked_before_writing(generated_assets, tmp_path):
    assets = generated_assets[0].folder.parent
    (tmp_path / "records.jsonl").write_text("keep me\n")
    with pytest.raises(CommandError, match="--assets"):
        sapien_data.generate("manipulation", 1, tmp_path, 0, "seen", protocol="manipllm")
    empty = tmp_path / "split.json"
    empty.write_text('{"seen": ["Chair"], "unseen": ["Clock"]}')
    with pytest.raises(CommandError, match="no seen objects"):
        sapien_data.generate("manipulation", 1, tmp_path, 0, "seen", assets=assets, split_file=empty)
    assert (tmp_path / "records.jsonl").read_text() == "keep me\n"


@pytest.mark.slow
def test_two_views_show_the_front_as_target_and_a_wrist_camera(tmp_path):
    """``--views front,wrist``: the front image and the ground truth are those of a front-only record of the
    same seed, pixel for pixel; the wrist view is another size, shows the object, and is named in meta."""
    ok, reason = rendering_status(in_process=True)
    if not ok:
        pytest.skip(f"Vulkan rendering unavailable: {reason}")
    one = read_records(sapien_data.generate("manipulation", 2, tmp_path / "one", 5, "train"))
    two = read_records(
        sapien_data.generate("manipulation", 2, tmp_path / "two", 5, "train", views=("front", "wrist"))
    )
    for alone, pair in zip(one, two, strict=True):
        assert pair.target_image == 0 and pair.image == pair.images[0] and len(pair.images) == 2
        assert pair.ground_truth == alone.ground_truth and pair.meta["views"] == ["front", "wrist"]
        front, wrist = (np.asarray(Image.open(p).convert("RGB")) for p in pair.images)
        assert np.array_equal(front, np.asarray(Image.open(alone.image).convert("RGB")))
        assert wrist.shape == (224, 224, 3)
        spec = EpisodeSpec.from_meta(pair.meta)
        built, _ = render_episode(spec)
        seen = render_view(built, spec, view_camera("wrist", spec.camera))
        assert np.array_equal(seen.rgb, wrist)  # the wrist view is fixed by the record's meta
        assert (seen.link_ids >= 0).mean() > 0.2  # and the object fills much of it


def test_views_are_checked_before_anything_renders():
    assert parse_views("front, wrist") == ("front", "wrist")
    for text, problem in [
        ("wrist,front", "the first view must be front"),
        ("front,top", "unknown view 'top'; choose from front, wrist"),
        ("front,front", "named twice"),
        ("", "the first view must be front"),
    ]:
        with pytest.raises(ValueError, match=problem):
            parse_views(text)
