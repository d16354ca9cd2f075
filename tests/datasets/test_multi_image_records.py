"""Records with several images or a video: the JSONL form, its round trip, every hostile variant as one line
naming the record, and check-data decoding every image and frame and counting images against model.max_images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from vlm_grpoma.answers import Points
from vlm_grpoma.datasets.check import check_records, summary
from vlm_grpoma.datasets.jsonl import RecordError, load_records, read_records, write_records
from vlm_grpoma.datasets.schema import Record, record_to_json


def _views(folder: Path) -> dict:
    """A front camera (the target, 100x50) and a wrist camera of another size, as a two-image record."""
    (folder / "views").mkdir(exist_ok=True)
    Image.new("RGB", (100, 50), (200, 10, 10)).save(folder / "views" / "front.png")
    Image.new("RGB", (64, 80), (10, 10, 200)).save(folder / "views" / "wrist.png")
    return {
        "id": "two-views",
        "images": ["views/wrist.png", "views/front.png"],
        "target_image": 1,
        "task": "affordance",
        "prompt": "the handle",
        "width": 100,
        "height": 50,
        "ground_truth": {"points": [[90, 40]]},
    }


def _write(path: Path, objects: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
    return path


def test_a_two_view_record_reads_with_its_target_and_round_trips(tmp_path):
    (record,) = read_records(_write(tmp_path / "r.jsonl", [_views(tmp_path)]), check_images=True)
    front, wrist = str(tmp_path / "views" / "front.png"), str(tmp_path / "views" / "wrist.png")
    assert record.prompt_images == (wrist, front) and record.target_image == 1
    assert record.image == front and (record.width, record.height) == (100, 50)
    assert record.ground_truth.points == ((90, 40),)  # bounds checked in the target's 100x50 pixels
    out = write_records(tmp_path / "copy.jsonl", [record])
    line = json.loads(out.read_text())
    assert "image" not in line and line["target_image"] == 1
    assert line["images"] == ["views/wrist.png", "views/front.png"]  # relative to the records' folder
    assert read_records(out) == [record]
    elsewhere = json.loads(write_records(tmp_path / "out" / "r.jsonl", [record]).read_text())
    assert elsewhere["images"] == [wrist, front]


def test_a_one_item_images_list_is_the_one_image_form(tmp_path):
    obj = _views(tmp_path) | {"images": ["views/front.png"]}
    del obj["target_image"]
    (record,) = read_records(_write(tmp_path / "r.jsonl", [obj]))
    assert record.images == () and record.image == str(tmp_path / "views" / "front.png")
    assert "images" not in record_to_json(record) and record_to_json(record)["image"] == record.image


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": "views/front.png"}, "images: give image (one) or images (several), not both"),
        ({"images": []}, "images: needs at least 1 item(s), got 0"),
        ({"images": "views/front.png"}, "images: must be a list"),
        ({"images": ["views/front.png", ""]}, "images[1]: must be a non-empty path string"),
        ({"target_image": 2}, "target_image: must be an index of images, 0 to 1, got 2"),
        ({"target_image": True}, "target_image: must be an index of images, 0 to 1, got true"),
        ({"width": None}, "width: must be a positive integer"),
    ],
)
def test_each_malformed_image_list_is_one_line_naming_the_record(tmp_path, change, message):
    path = _write(tmp_path / "r.jsonl", [_views(tmp_path) | change])
    (error,) = load_records(path).errors
    assert str(error).startswith(f"{path}:1 (id two-views): {message}"), str(error)


def test_target_image_without_images_is_refused(tmp_path):
    obj = _views(tmp_path) | {"image": "views/front.png"}
    del obj["images"]
    (error,) = load_records(_write(tmp_path / "r.jsonl", [obj])).errors
    assert "target_image: names one of images; a record with image has only that one" in str(error)


def test_a_record_built_in_code_keeps_its_image_and_images_consistent():
    with pytest.raises(ValueError, match="image must be images\\[target_image\\]"):
        Record("x", "a.png", "affordance", "p", 4, 4, _points(), images=("a.png", "b.png"), target_image=1)
    with pytest.raises(ValueError, match="one image is given as image, not images"):
        Record("x", "a.png", "affordance", "p", 4, 4, _points(), images=("a.png",))


def _points() -> Points:
    return Points(((1.0, 1.0),))


def test_a_missing_second_image_is_one_error_naming_the_record_and_file(tmp_path):
    obj = _views(tmp_path)
    path = _write(
        tmp_path / "r.jsonl", [obj, obj | {"id": "gone", "images": ["views/front.png", "views/x.png"]}]
    )
    with pytest.raises(RecordError, match=r"r.jsonl:2 \(id gone\): .*views/x.png: image file not found"):
        read_records(path, check_images=True)
    check = check_records([path])
    assert [r.id for r in check.records] == ["two-views"]
    (error,) = check.errors
    assert error.startswith(f"{path}:2") and "views/x.png" in error and "not found" in error


def test_only_the_target_image_must_have_the_records_size(tmp_path):
    obj = _views(tmp_path)
    wrong_target = obj | {"id": "wrong", "target_image": 0}  # the 64x80 wrist view is not 100x50
    check = check_records([_write(tmp_path / "r.jsonl", [obj, wrong_target])])
    assert [r.id for r in check.records] == ["two-views"]
    assert "wrist.png: image is 64x80" in check.errors[0] and "record says 100x50" in check.errors[0]
    assert "images per prompt: 2 image(s): 1 record(s) (model.max_images must be at least 2)" in summary(
        check
    )


def test_an_image_outside_the_image_root_is_refused_whichever_it_is(tmp_path):
    obj = _views(tmp_path)
    (tmp_path / "root").mkdir()
    path = _write(
        tmp_path / "root" / "r.jsonl", [obj | {"images": ["../views/front.png", "../views/wrist.png"]}]
    )
    with pytest.raises(RecordError, match="is outside data.image_root"):
        read_records(path, image_root=tmp_path / "root")


def _video_record(folder: Path, frames: int = 3, sizes: list | None = None) -> dict:
    """The last frames before the action as a video, and the current frame as the image the points are in."""
    sizes = sizes or [(48, 32)] * frames
    for i, size in enumerate(sizes):
        Image.new("RGB", size, (30 * i, 90, 90)).save(folder / f"f{i}.png")
    Image.new("RGB", (100, 50)).save(folder / "now.png")
    return {
        "id": "clip",
        "image": "now.png",
        "video": {"frames": [f"f{i}.png" for i in range(len(sizes))], "fps": 4},
        "task": "affordance",
        "prompt": "the handle",
        "width": 100,
        "height": 50,
        "ground_truth": {"points": [[90, 40]]},
    }


def test_a_video_record_reads_checks_and_round_trips(tmp_path):
    (record,) = read_records(_write(tmp_path / "r.jsonl", [_video_record(tmp_path)]), check_images=True)
    assert (
        record.video.frames == tuple(str(tmp_path / f"f{i}.png") for i in range(3)) and record.video.fps == 4
    )
    assert record.image == str(tmp_path / "now.png") and not record.text_only
    check = check_records([tmp_path / "r.jsonl"])
    assert check.ok and "videos: 1 record(s), 1 as frames (3-3 frames)" in "\n".join(summary(check))
    copy = write_records(tmp_path / "copy.jsonl", [record])
    assert json.loads(copy.read_text())["video"] == {"frames": ["f0.png", "f1.png", "f2.png"], "fps": 4.0}
    assert read_records(copy) == [record]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"video": {"frames": ["f0.png"]}}, "video.frames: a video needs at least 2 frames"),
        ({"video": {"frames": []}}, "video.frames: a video needs at least 2 frames"),
        ({"video": {"frames": ["f0.png", 3]}}, "video.frames[1]: must be a non-empty path string"),
        ({"video": {"frames": ["f0.png", "f1.png"], "fps": 0}}, "video.fps: must be > 0"),
        (
            {"video": {"frames": ["f0.png", "f1.png"], "path": "clip.mp4"}},
            'video: give "frames" (image files) or "path"',
        ),
        ({"video": {"clip": "x.mp4"}}, "video.clip: unknown key"),
        ({"video": {"path": ""}}, "video.path: must be a non-empty path string"),
        ({"video": ["f0.png", "f1.png"]}, "video: must be an object"),
    ],
)
def test_each_malformed_video_is_one_line_naming_the_record(tmp_path, change, message):
    path = _write(tmp_path / "r.jsonl", [_video_record(tmp_path) | change])
    (error,) = load_records(path).errors
    assert str(error).startswith(f"{path}:1 (id clip): {message}"), str(error)


def test_a_video_alone_cannot_carry_coordinates_but_can_carry_a_short_answer(tmp_path):
    obj = _video_record(tmp_path)
    for key in ("image", "width", "height"):
        del obj[key]
    (error,) = load_records(_write(tmp_path / "r.jsonl", [obj])).errors
    assert "video: a affordance record needs an image for its coordinates" in str(error)
    answer = obj | {"task": "answer", "ground_truth": {"answer": "left"}}
    (record,) = read_records(_write(tmp_path / "a.jsonl", [answer]), check_images=True)
    assert record.image is None and record.video is not None and not record.text_only


def test_frames_must_exist_and_share_one_size(tmp_path):
    obj = _video_record(tmp_path, sizes=[(48, 32), (48, 32), (40, 32)])
    path = _write(
        tmp_path / "r.jsonl", [obj, obj | {"id": "gone", "video": {"frames": ["f0.png", "nope.png"]}}]
    )
    check = check_records([path])
    assert check.records == [] and len(check.errors) == 2
    assert (
        check.errors[0].startswith(f"{path}:1")
        and "f2.png: video frame is 40x32 but the first frame is 48x32" in check.errors[0]
    )
    assert check.errors[1].startswith(f"{path}:2") and "nope.png: image file not found" in check.errors[1]
    with pytest.raises(RecordError, match=r"r.jsonl:1 \(id clip\): .*f2.png: video frame is 40x32"):
        read_records(path, check_images=True)


def _clip(path: Path, frames: int = 20, rate: int = 10) -> Path:
    """An MPEG-4 clip of ``frames`` frames at ``rate`` per second, each frame's red level its index * 12."""
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            pixels = np.zeros((48, 64, 3), np.uint8)
            pixels[..., 0] = i * 12
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_a_video_file_is_sampled_at_its_fps(tmp_path):
    import av
    import numpy as np

    from vlm_grpoma.datasets.images import decode_video, load_video_frames

    clip = _clip(tmp_path / "clip.mp4")
    obj = _video_record(tmp_path) | {"video": {"path": "clip.mp4", "fps": 2}}
    (record,) = read_records(_write(tmp_path / "r.jsonl", [obj]), check_images=True)
    assert record.video.path == str(clip) and record.video.frames == ()
    with av.open(str(clip)) as container:  # every frame, then those at 0, 0.5, 1 and 1.5 s (10 per second)
        every = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    sampled = load_video_frames(record)
    assert len(sampled) == 4 and all(
        np.array_equal(np.asarray(f), every[i]) for f, i in zip(sampled, (0, 5, 10, 15))
    )
    with pytest.raises(Exception, match="more than 3 frames at 2 per second"):
        decode_video(str(clip), 2.0, 3, "clip")
    assert json.loads(write_records(tmp_path / "copy.jsonl", [record]).read_text())["video"] == {
        "path": "clip.mp4",
        "fps": 2.0,
    }


def test_a_video_file_that_is_not_one_is_one_error_naming_the_record(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"not a video at all")
    obj = _video_record(tmp_path) | {"video": {"path": "clip.mp4"}}
    path = _write(tmp_path / "r.jsonl", [obj, obj | {"id": "gone", "video": {"path": "nope.mp4"}}])
    report = load_records(path)
    assert len(report.records) == 2  # the schema is fine; the files are not
    check = check_records([path])
    assert check.records == [] and len(check.errors) == 2
    assert check.errors[0].startswith(f"{path}:1") and "clip.mp4: cannot" in check.errors[0]
    assert check.errors[1].startswith(f"{path}:2") and "nope.mp4: video file not found" in check.errors[1]
    with pytest.raises(RecordError, match=r"r.jsonl:1 \(id clip\): .*clip.mp4: cannot open video"):
        read_records(path, check_images=True)
