"""Load a record's image (RGB, EXIF orientation applied) or mask, with errors naming the record and path;
check every image of a dataset up front.

Records store width/height of the image as displayed, i.e. after EXIF orientation; a photo whose stored
pixels are landscape but whose orientation tag says "rotate 90°" is portrait here, and so are its boxes.

:func:`image_problems` checks that each record's image (and mask) exists, decodes, has the record's size, and
has sane dimensions (at most :data:`MAX_IMAGE_PIXELS` pixels, aspect ratio at most :data:`MAX_ASPECT_RATIO`),
in parallel threads, with the results of unchanged files cached per records file, so a bad image is found
when the records are loaded rather than when it is first sampled.

A path that is not a regular file (a FIFO, a device, a folder) is refused without being opened: reading a FIFO
blocks forever. 16-bit greyscale pixels are scaled to 8 bits (``v / 257``; PIL's own conversion clips them
to white); 32-bit integer or float pixels have no agreed range and are refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.datasets.schema import MaskRef, Record
from vlm_grpoma.errors import DataError

#: Larger images are refused (PIL's own decompression-bomb limit): they would be decoded on every sample.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
#: Longer / shorter side; Qwen-VL image processors refuse images beyond this (qwen-vl-utils' MAX_RATIO).
MAX_ASPECT_RATIO = 200

#: EXIF orientations (tag 0x0112) that swap width and height.
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}
_ORIENTATION_TAG = 0x0112


class ImageLoadError(DataError):
    """An image or mask that is missing, unreadable, or not the size its record says."""


class TooManyFrames(ImageLoadError):
    """A video that gives more frames than the reader takes."""


def _describe(path: str | Path, record_id: str | None) -> str:
    return (f"record {record_id}: " if record_id else "") + f"{path}"


def _file_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be read as an image file without opening it: missing, or not a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except OSError as err:
        return f"cannot read: {err.strerror or err}"
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "a special file"
        return f"is {kind}, not a regular file"
    return None


def _require_file(path: str | Path, record_id: str | None, what: str) -> None:
    problem = _file_problem(path)
    if problem is not None:
        raise ImageLoadError(f"{_describe(path, record_id)}: {what} {problem}")


#: 16-bit greyscale modes (PNG reads as ``I;16``); 8-bit is what the processors take.
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def _depth_problem(img: Image.Image) -> str | None:
    """Why pixels of ``img`` have no 8-bit meaning: 32-bit integer or float samples (16-bit PNG is fine)."""
    if img.mode in ("I", "F") and not (img.mode == "I" and img.format == "PNG"):
        return f"has 32-bit {'float' if img.mode == 'F' else 'integer'} pixels (mode {img.mode}); save it as 8-bit"
    return None


def _to_rgb(img: Image.Image) -> Image.Image:
    """RGB pixels; 16-bit greyscale (PNG: mode ``I;16``, or ``I`` in older Pillow: ``_open`` refuses other
    ``I`` images) scaled to 8 bits."""
    if img.mode in _SIXTEEN_BIT or img.mode == "I":
        levels = np.asarray(img, dtype=np.float64) / 257.0
        img = Image.fromarray(np.clip(np.rint(levels), 0, 255).astype(np.uint8), mode="L")
    return img.convert("RGB")


def _open(path: str | Path, record_id: str | None, what: str) -> Image.Image:
    """The decoded image with EXIF orientation applied; any failure becomes ImageLoadError."""
    _require_file(path, record_id, what)
    try:
        with Image.open(path) as img:
            img.load()
            problem = _depth_problem(img) if what == "image" else None  # a mask is any non-zero sample
            if problem is not None:
                raise ImageLoadError(f"{_describe(path, record_id)}: image {problem}")
            return ImageOps.exif_transpose(img)
    except ImageLoadError:
        raise
    except FileNotFoundError:
        raise ImageLoadError(f"{_describe(path, record_id)}: {what} file not found") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageLoadError(f"{_describe(path, record_id)}: cannot decode {what}: {err}") from None


def _check_size(size: tuple[int, int], record: Record, path: str | Path, what: str) -> None:
    if size != (record.width, record.height):
        raise ImageLoadError(
            f"{_describe(path, record.id)}: {what} is {size[0]}x{size[1]} (after EXIF "
            f"orientation) but the record says {record.width}x{record.height}"
        )


def load_image(record_or_path: Record | str | Path, record_id: str | None = None) -> Image.Image:
    """An RGB image with EXIF orientation applied; for a Record its size must match width/height."""
    record = record_or_path if isinstance(record_or_path, Record) else None
    path = record.image if record else record_or_path
    rid = record.id if record else record_id
    img = _open(path, rid, "image")
    try:
        img = _to_rgb(img)
    except ValueError as err:  # a mode PIL cannot convert (e.g. LAB)
        raise ImageLoadError(f"{_describe(path, rid)}: cannot convert image to RGB: {err}") from None
    if record is not None:
        _check_size(img.size, record, path, "image")
    return img


def load_prompt_images(record: Record) -> list[Image.Image]:
    """Every image of the record's prompt in order (RGB, EXIF applied); the target image must have the
    record's size, the others any size."""
    return [
        load_image(record) if p == record.image else load_image(p, record.id) for p in record.prompt_images
    ]


#: Frames a video file may yield at its record's rate before it is refused (``model.max_video_frames`` bounds
#: what a model takes; this bounds what any reader decodes, a long file at a high rate among them).
MAX_DECODED_FRAMES = 1024


def load_video_frames(record: Record, max_frames: int = MAX_DECODED_FRAMES) -> list[Image.Image]:
    """The record's video frames in order (RGB), all of one size: its frame files (EXIF applied), or its video
    file sampled at ``fps``; more than ``max_frames`` is an ImageLoadError naming the record."""
    if record.video is None:
        return []
    if record.video.path:
        return decode_video(record.video.path, record.video.fps, max_frames, record.id)
    if len(record.video.frames) > max_frames:
        raise TooManyFrames(
            f"record {record.id}: a video of {len(record.video.frames)} frames, more than {max_frames}"
        )
    frames = [load_image(path, record.id) for path in record.video.frames]
    for path, frame in zip(record.video.frames, frames):
        if frame.size != frames[0].size:
            raise ImageLoadError(
                f"{_describe(path, record.id)}: {_frame_size_problem(frame.size, frames[0].size)}"
            )
    return frames


def decode_video(path: str, fps: float, max_frames: int, record_id: str | None = None) -> list[Image.Image]:
    """The frames of a video file at ``fps`` frames a second (the first at time 0, then each first frame at or
    after the next 1 / fps), with PyAV (qwen-vl-utils' own dependency); at least 2 and at most ``max_frames``."""
    import av

    _require_file(path, record_id, "video")
    frames, next_time = [], 0.0
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ImageLoadError(f"{_describe(path, record_id)}: video file has no video stream")
            for frame in container.decode(container.streams.video[0]):
                time = 0.0 if frame.time is None else float(frame.time)
                if time + 1e-6 < next_time:
                    continue
                if len(frames) == max_frames:
                    raise TooManyFrames(
                        f"{_describe(path, record_id)}: more than {max_frames} frames at {fps:g} per second; "
                        "lower video.fps or cut the clip"
                    )
                frames.append(frame.to_image().convert("RGB"))
                next_time += 1.0 / fps
    except av.FFmpegError as err:
        raise ImageLoadError(f"{_describe(path, record_id)}: cannot decode video: {err}") from None
    if len(frames) < 2:
        raise ImageLoadError(
            f"{_describe(path, record_id)}: {len(frames)} frame(s) at {fps:g} per second; a video needs 2"
        )
    return frames


def _frame_size_problem(size: tuple[int, int], first: tuple[int, int]) -> str:
    return f"video frame is {size[0]}x{size[1]} but the first frame is {first[0]}x{first[1]}; frames share one size"


def image_size(path: str | Path, record_id: str | None = None) -> tuple[int, int]:
    """(width, height) after EXIF orientation, read from the header without decoding the pixels."""
    _require_file(path, record_id, "image")
    try:
        with Image.open(path) as img:
            width, height = img.size
            orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    except FileNotFoundError:
        raise ImageLoadError(f"{_describe(path, record_id)}: image file not found") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageLoadError(f"{_describe(path, record_id)}: cannot read image header: {err}") from None
    return (height, width) if orientation in _TRANSPOSING_ORIENTATIONS else (width, height)


def load_mask(record_or_path: Record | str | Path, record_id: str | None = None) -> np.ndarray:
    """A boolean [height, width] mask: True where any colour channel (or palette index) is non-zero.

    For a Record the mask path is its ``MaskRef`` ground truth and the size must match width/height.
    """
    record = record_or_path if isinstance(record_or_path, Record) else None
    if record is not None:
        if not isinstance(record.ground_truth, MaskRef):
            raise ImageLoadError(f"record {record.id}: ground truth is not a mask")
        path: str | Path = record.ground_truth.path
    else:
        path = record_or_path  # type: ignore[assignment]
    rid = record.id if record else record_id
    img = _open(path, rid, "mask")
    if record is not None:
        _check_size(img.size, record, path, "mask")
    array = np.asarray(img)
    if img.mode in ("RGBA", "LA"):  # the alpha channel is opacity, not the region
        array = array[..., :-1]
    return array.any(axis=2) if array.ndim == 3 else array != 0


# ---------------------------------------------------------------------------------------------------------
# Up-front checks of a dataset's images


def _inspect(path: str) -> list[Any]:
    """``[width, height]`` after EXIF orientation once the file fully decodes, else ``[problem]``."""
    problem = _file_problem(path)
    if problem is not None:
        return [problem]
    try:
        with Image.open(path) as img:
            width, height = img.size
            depth = _depth_problem(img)
            if depth is not None:
                return [depth]
            if width * height > MAX_IMAGE_PIXELS:
                return [f"{width}x{height} is {width * height} pixels, more than {MAX_IMAGE_PIXELS}"]
            if img.format == "JPEG":  # decode at 1/8 scale: the whole stream is read, 20x less work
                img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
            orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    except FileNotFoundError:
        return ["file not found"]
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        return [f"cannot decode: {err}"]
    return [height, width] if orientation in _TRANSPOSING_ORIENTATIONS else [width, height]


def _size_problem(found: list[Any], record: Record | None, what: str) -> str | None:
    """Why an inspected file cannot serve: it does not decode, is not the record's size (``record`` None: any
    size, an image that is not the target), or has an aspect ratio Qwen-VL refuses."""
    if len(found) == 1:
        return f"{what} {found[0]}"
    width, height = found
    if record is not None and (width, height) != (record.width, record.height):
        return f"{what} is {width}x{height} (after EXIF orientation) but the record says {record.width}x{record.height}"
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        return f"{what} is {width}x{height}: aspect ratio beyond {MAX_ASPECT_RATIO}:1, which Qwen-VL refuses"
    return None


def _video_file_problem(path: str) -> str | None:
    """Why ``path`` is not a readable video file (missing, not a regular file, no video stream), else None;
    the stream is opened, not decoded."""
    import av

    problem = _file_problem(path)
    if problem is not None:
        return f"video {problem}"
    try:
        with av.open(str(path)) as container:
            return None if container.streams.video else "video file has no video stream"
    except av.FFmpegError as err:
        return f"cannot open video: {err}"


@contextmanager
def _checks_cache(key: str | None):
    """The cached results for ``key`` (a records file), locked so that ranks starting together check once."""
    if key is None:
        yield {}
        return
    folder = cache_dir() / "image-checks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "a")  # held (locked) for the block
    except OSError:  # an unwritable cache only costs time
        yield {}
        return
    path = folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cached = {}
        results = dict(cached) if isinstance(cached, dict) else {}
        yield results
        if results != cached:
            try:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(results), encoding="utf-8")
                os.replace(tmp, path)
            except OSError:
                pass


def _fingerprint(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns]


def image_problems(
    records: Sequence[Record], *, cache_key: str | None = None, workers: int | None = None
) -> dict[int, str]:
    """``{index: problem}`` for every record whose image or mask is missing, does not decode, differs from the
    record's size, or is out of bounds; files are checked in parallel, each once.

    ``cache_key`` (e.g. the records file's path) keeps the results of unchanged files for the next load.
    """
    paths = sorted(
        {path for r in records for path in r.prompt_images}
        | {path for r in records if r.video is not None for path in r.video.frames}
        | {r.ground_truth.path for r in records if isinstance(r.ground_truth, MaskRef)}
    )
    with _checks_cache(cache_key) as cache:
        found: dict[str, list[Any]] = {}
        todo = []
        for path in paths:
            stamp = _fingerprint(path)
            entry = cache.get(path)
            if stamp is not None and entry is not None and entry[:2] == stamp:
                found[path] = entry[2:]
            else:
                todo.append((path, stamp))
        if todo:
            threads = workers or min(16, os.cpu_count() or 1)
            with ThreadPoolExecutor(threads) as pool:
                for (path, stamp), result in zip(todo, pool.map(_inspect, [p for p, _ in todo])):
                    found[path] = result
                    if stamp is not None:
                        cache[path] = stamp + result
    problems = {}
    for index, record in enumerate(records):
        files = [(path, record if path == record.image else None, "image") for path in record.prompt_images]
        if isinstance(record.ground_truth, MaskRef):
            files.append((record.ground_truth.path, record, "mask"))
        frames = () if record.video is None else record.video.frames
        files += [(path, None, "video frame") for path in frames]
        # a video file: found and opened here, decoded when its prompt is built
        if record.video is not None and record.video.path:
            problem = _video_file_problem(record.video.path)
            if problem is not None:
                problems[index] = f"{record.video.path}: {problem}"
                continue
        for path, sized_by, what in files:  # text-only: no file to open
            problem = _size_problem(found[path], sized_by, what)
            if problem is None and what == "video frame" and found[path] != found[frames[0]]:
                problem = _frame_size_problem(tuple(found[path]), tuple(found[frames[0]]))
            if problem is not None:
                problems[index] = f"{path}: {problem}"
                break
    return problems


__all__ = [
    "MAX_ASPECT_RATIO",
    "MAX_DECODED_FRAMES",
    "MAX_IMAGE_PIXELS",
    "ImageLoadError",
    "TooManyFrames",
    "image_problems",
    "image_size",
    "load_image",
    "load_mask",
    "load_prompt_images",
    "decode_video",
    "load_video_frames",
]
