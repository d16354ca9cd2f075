"""Check a dataset up front (``vlm-grpoma check-data``, see :mod:`~vlm_grpoma.models.prompt_check`): every
record, every image and mask.

:func:`check_records` is the one validation a records file goes through before a run uses it: the record
schema (:mod:`~vlm_grpoma.datasets.jsonl`), then each image decoded once (exists, decodes, has the record's
width x height after EXIF orientation, an aspect ratio Qwen-VL processors accept) and each mask (same size,
not empty). Errors name ``file:line (id)``, in file order.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpoma.datasets.images import ImageLoadError, load_image, load_mask, load_video_frames
from vlm_grpoma.datasets.jsonl import load_records
from vlm_grpoma.datasets.schema import MaskRef, Record

#: Qwen-VL processors refuse images whose long side is more than this many times the short side.
MAX_ASPECT_RATIO = 200


@dataclass
class DataCheck:
    """What :func:`check_records` found: the records that passed, where each came from, and every error."""

    records: list[Record] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # "file:line" of each passing record
    errors: list[str] = field(default_factory=list)
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # decoded image path -> (w, h)
    lines: int = 0  # records read, valid or not

    @property
    def ok(self) -> bool:
        return not self.errors

    def counts(self) -> Counter[tuple[str, str]]:
        """Passing records per (task, split)."""
        return Counter((r.task, r.split) for r in self.records)


def _decoded_size(path: str, cache: dict[str, tuple[int, int] | ImageLoadError]) -> tuple[int, int]:
    """(width, height) of the fully decoded image, decoding each path once; ImageLoadError if it fails."""
    if path not in cache:
        try:
            cache[path] = load_image(path).size
        except ImageLoadError as err:
            cache[path] = err
    found = cache[path]
    if isinstance(found, ImageLoadError):
        raise found
    return found


def check_record_files(record: Record, cache: dict[str, Any] | None = None) -> None:
    """Raise ImageLoadError unless every image of the record (and its mask) decodes and is usable, and the
    target image (and mask) has the record's size."""
    cache = {} if cache is None else cache
    for path in record.prompt_images:  # a text-only record has no file to check
        try:
            width, height = _decoded_size(path, cache)
        except ImageLoadError as err:
            raise ImageLoadError(f"record {record.id}: {err}") from None
        if path == record.image and (width, height) != (record.width, record.height):
            raise ImageLoadError(
                f"record {record.id}: {path}: image is {width}x{height} (after EXIF orientation) but the "
                f"record says {record.width}x{record.height}"
            )
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ImageLoadError(
                f"record {record.id}: {path}: aspect ratio {max(width, height) / min(width, height):.0f}:1 "
                f"is above the {MAX_ASPECT_RATIO}:1 Qwen-VL processors accept; crop or pad the image"
            )
    load_video_frames(record)  # each frame decodes, all of one size (the error names the record)
    if isinstance(record.ground_truth, MaskRef) and not load_mask(record).any():
        raise ImageLoadError(f"record {record.id}: {record.ground_truth.path}: mask is empty")


def check_records(paths: Sequence[str | Path], *, files: bool = True) -> DataCheck:
    """Validate every record of ``paths`` (and, with ``files``, its image and mask); never stops early.
    Errors come in file order, each starting with ``file:line``."""
    check, cache = DataCheck(), {}
    for path in paths:
        report = load_records(path)
        check.lines += len(report.records) + len(report.errors)
        prefix = re.compile(rf"^{re.escape(str(report.path))}:(\d+)")
        found = [(int(prefix.match(str(err)).group(1)), str(err)) for err in report.errors]
        for record, line in zip(report.records, report.lines):
            where = f"{report.path}:{line}"
            if files:
                try:
                    check_record_files(record, cache)
                except ImageLoadError as err:
                    found.append((line, f"{where}: {err}"))
                    continue
            check.records.append(record)
            check.where.append(where)
        check.errors += [message for _, message in sorted(found, key=lambda item: item[0])]
    check.image_sizes = {p: size for p, size in cache.items() if isinstance(size, tuple)}
    return check


def summary(check: DataCheck) -> list[str]:
    """The lines ``check-data`` prints about the records: counts per task/split and image sizes."""
    lines = [f"records: {len(check.records)} valid of {check.lines} read, {len(check.errors)} with errors"]
    for (task, split), n in sorted(check.counts().items()):
        lines.append(f"  {task}/{split}: {n}")
    videos = [r.video for r in check.records if r.video is not None]
    if videos:
        counts = [len(v.frames) for v in videos if v.frames]
        lists = f"{len(counts)} as frames ({min(counts)}-{max(counts)} frames)" if counts else ""
        files = f"{len(videos) - len(counts)} as video files" if len(videos) > len(counts) else ""
        lines.append(
            f"videos: {len(videos)} record(s), {', '.join(p for p in (lists, files) if p)} (model.max_video_frames "
            "must cover them)"
        )
    if check.image_sizes:
        sizes = list(check.image_sizes.values())
        widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
        pixels = [w * h for w, h in sizes]
        counts = Counter(len(r.prompt_images) for r in check.records if r.prompt_images)
        if counts and max(counts) > 1:
            per = ", ".join(f"{n} image(s): {k} record(s)" for n, k in sorted(counts.items()))
            lines.append(f"images per prompt: {per} (model.max_images must be at least {max(counts)})")
        lines.append(
            f"images: {len(sizes)} distinct; width {min(widths)}-{max(widths)}, height "
            f"{min(heights)}-{max(heights)}, megapixels {min(pixels) / 1e6:.2f}-{max(pixels) / 1e6:.2f}"
        )
    return lines


__all__ = [
    "MAX_ASPECT_RATIO",
    "DataCheck",
    "check_record_files",
    "check_records",
    "summary",
]
