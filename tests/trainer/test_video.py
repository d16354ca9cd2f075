"""Video records, every family: the prompt holds the video's tokens (with Qwen3-VL's timestamps), the log-probs
the HF rollout records equal the trainer's naive and shared-prefix passes (values and gradients) in a batch
with image-only and text-only prompts, and the frames really reach the model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from PIL import Image

from tests.trainer.pass_agreement import assert_recorded_equals_naive, assert_shared_equals_naive
from vlm_grpoma.answers import Points
from vlm_grpoma.config import ModelConfig
from vlm_grpoma.datasets.schema import Record, ShortAnswer, Video
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.logprobs import path_log_probs

FRAME = (80, 56)


def _frames(folder, count: int, shade: int) -> tuple[str, ...]:
    paths = []
    for i in range(count):
        path = folder / f"f{shade}-{i}.png"
        Image.new("RGB", FRAME, (shade, 20 * i, 200 - 20 * i)).save(path)
        paths.append(str(path))
    return tuple(paths)


def _records(folder, shade: int = 40) -> list[Record]:
    """A video + current-frame affordance record (3 frames: an odd count), a video-only answer record, an
    image-only record and a text-only one."""
    Image.new("RGB", (90, 70), (200, 30, 30)).save(folder / "now.png")
    point = (10.0, 10.0)
    video = Video(_frames(folder, 3, shade), fps=1.0)
    return [
        Record(
            "vid+img",
            str(folder / "now.png"),
            "affordance",
            "the handle",
            90,
            70,
            Points((point,)),
            video=video,
        ),
        Record(
            "vid",
            None,
            "answer",
            "What moved?",
            None,
            None,
            ShortAnswer("cup"),
            video=replace(video, fps=2.0),
        ),
        Record("img", str(folder / "now.png"), "affordance", "the handle", 90, 70, Points((point,))),
        Record("text", None, "answer", "What is 2+3?", None, None, ShortAnswer("5")),
    ]


def _load(tiny_model_dir, arch):
    config = ModelConfig(
        name_or_path=str(tiny_model_dir(arch)), dtype="float32", max_pixels=112 * 112, max_video_frames=4
    )
    loaded = load_model(config)
    return loaded.model.eval(), loaded.adapter


def test_the_prompt_holds_the_video_before_the_image(arch, tiny_model_dir, tmp_path):
    _, adapter = _load(tiny_model_dir, arch)
    both, alone, image_only, _ = adapter.build_inputs(_records(tmp_path))
    assert both.video is not None and image_only.video is None and alone.images == ()
    assert both.video.frames.shape[0] == 4  # 3 frames, the last repeated: Qwen-VL encodes pairs
    t, h, w = both.video.grid_thw[0].tolist()
    merge = adapter.family.factor // adapter.family.patch_size
    assert t == 2 and int((both.input_ids == adapter.tokens.video_id).sum()) == t * h * w // merge**2
    assert both.text.index("Video 1:") < both.text.index("Picture 1:")
    assert "Coordinates are in Picture 1." in both.text and "Picture" not in image_only.text
    assert (both.video.second_per_grid_ts is not None) == (arch == "qwen2_5_vl")
    if arch == "qwen2_5_vl":  # 2 frames per temporal patch at 1 fps
        assert both.video.second_per_grid_ts.tolist() == [2.0]
    if arch == "qwen3_vl":  # timestamps in the text, one per temporal patch
        assert "seconds>" in adapter.tokenizer.decode(both.input_ids)


def test_rollout_logprobs_equal_the_naive_and_shared_passes(arch, tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    model, adapter = _load(tiny_model_dir, arch)
    prompts = adapter.build_inputs(_records(tmp_path))
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=2, max_thought_tokens=6, max_answer_tokens=4, seed=4
    )
    tree = HFRolloutEngine.for_adapter(model, adapter).sample(prompts, params)
    assert_recorded_equals_naive(model, tree, adapter.tokens)

    assert_shared_equals_naive(model, tree, [3, 1, 0, 2], adapter.tokens, seed=3)

    other = adapter.build_inputs(_records(tmp_path, shade=250))
    with torch.no_grad():
        seen = path_log_probs(model, replace(tree, prompts=other), [1], adapter.tokens)
        mine = path_log_probs(model, tree, [1], adapter.tokens)
    assert (seen.thought - mine.thought).abs().max() > 1e-4  # the frames reach the model


def test_a_video_beyond_model_max_video_frames_is_refused_naming_the_record(tiny_model_dir, tmp_path):
    config = ModelConfig(
        name_or_path=str(tiny_model_dir("qwen2_vl")), max_pixels=112 * 112, max_video_frames=2
    )
    adapter = load_model(config).adapter
    with pytest.raises(
        ValueError, match="record vid: a video of 3 frames, more than model.max_video_frames=2"
    ):
        adapter.build_inputs(_records(tmp_path)[1:2])


def test_a_video_file_prompts_as_its_sampled_frames(arch, tiny_model_dir, tmp_path):
    """``{"path": clip, "fps": 2}`` builds the prompt its frames at 0, 0.5, 1 and 1.5 s saved as images do."""
    import av
    import numpy as np

    with av.open(str(tmp_path / "clip.mp4"), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(20):
            pixels = np.full((48, 64, 3), (i * 12, 90, 30), np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(tmp_path / "clip.mp4")) as container:
        every = [f.to_image() for f in container.decode(container.streams.video[0])]
    for i in (0, 5, 10, 15):
        every[i].save(tmp_path / f"s{i}.png")
    frames = tuple(str(tmp_path / f"s{i}.png") for i in (0, 5, 10, 15))
    base = _records(tmp_path)[1]
    from_file = replace(base, video=Video(fps=2.0, path=str(tmp_path / "clip.mp4")))
    from_frames = replace(base, video=Video(frames, fps=2.0))
    _, adapter = _load(tiny_model_dir, arch)
    a, b = adapter.build_inputs([from_file, from_frames])
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.video.pixel_values, b.video.pixel_values)
    adapter.max_video_frames = 3
    with pytest.raises(ValueError, match="more than 3 frames at 2 per second.*model.max_video_frames"):
        adapter.build_inputs([from_file])
