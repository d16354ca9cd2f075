"""Check a dataset up front (``vlm-grpoma check-data``): every record, every image and mask, and optionally
the prompt length each record becomes for a model's processor.

:func:`check_records` is the one validation a records file goes through before a run uses it: the record
schema (:mod:`~vlm_grpoma.datasets.jsonl`), then each image decoded once (exists, decodes, has the record's
width x height after EXIF orientation, an aspect ratio Qwen-VL processors accept) and each mask (same size,
not empty). Errors name ``file:line (id)``, in file order.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vlm_grpoma.datasets.images import ImageLoadError, load_image, load_mask
from vlm_grpoma.datasets.jsonl import load_records
from vlm_grpoma.datasets.schema import MaskRef, Record
from vlm_grpoma.errors import DataError

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
    """Raise ImageLoadError unless the record's image (and mask) decode, match its size and are usable."""
    cache = {} if cache is None else cache
    try:
        width, height = _decoded_size(record.image, cache)
    except ImageLoadError as err:
        raise ImageLoadError(f"record {record.id}: {err}") from None
    if (width, height) != (record.width, record.height):
        raise ImageLoadError(
            f"record {record.id}: {record.image}: image is {width}x{height} (after EXIF orientation) but the "
            f"record says {record.width}x{record.height}"
        )
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageLoadError(
            f"record {record.id}: {record.image}: aspect ratio {max(width, height) / min(width, height):.0f}:1 "
            f"is above the {MAX_ASPECT_RATIO}:1 Qwen-VL processors accept; crop or pad the image"
        )
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


@dataclass(frozen=True)
class PromptLengths:
    """Prompt tokens (chat template, instruction and image tokens) of each record for one model's processor."""

    total: list[int]
    image: list[int]


def prompt_lengths(check: DataCheck, adapter: Any) -> PromptLengths:
    """Tokenise every passing record as training does (``adapter.build_inputs``); a record the processor
    refuses moves from ``check.records`` to ``check.errors``."""
    total, image, kept, where = [], [], [], []
    image_pad = adapter.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for record, place in zip(check.records, check.where):
        try:
            (inputs,) = adapter.build_inputs([record])
        except (ValueError, ImageLoadError) as err:
            check.errors.append(f"{place}: {err}")
            continue
        total.append(int(inputs.input_ids.numel()))
        image.append(int((inputs.input_ids == image_pad).sum()))
        kept.append(record)
        where.append(place)
    check.records, check.where = kept, where
    return PromptLengths(total, image)


# ---------------------------------------------------------------------------------------------------- CLI


def _spread(values: Sequence[float]) -> str:
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"


def summary(check: DataCheck, lengths: PromptLengths | None = None, model: str = "") -> list[str]:
    """The lines ``check-data`` prints: counts per task/split, image sizes, prompt lengths."""
    lines = [f"records: {len(check.records)} valid of {check.lines} read, {len(check.errors)} with errors"]
    for (task, split), n in sorted(check.counts().items()):
        lines.append(f"  {task}/{split}: {n}")
    if check.image_sizes:
        sizes = list(check.image_sizes.values())
        widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
        pixels = [w * h for w, h in sizes]
        lines.append(
            f"images: {len(sizes)} distinct; width {min(widths)}-{max(widths)}, height "
            f"{min(heights)}-{max(heights)}, megapixels {min(pixels) / 1e6:.2f}-{max(pixels) / 1e6:.2f}"
        )
    if lengths is not None and lengths.total:
        lines.append(
            f"prompt tokens for {model}: {_spread(lengths.total)} (image tokens {_spread(lengths.image)})"
        )
    return lines


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma check-data RECORDS... [--model M] [--config C]``; exit code 1 when any record is bad."""
    config = getattr(args, "config_obj", None)
    paths = list(args.records)
    if not paths and config is not None:
        paths = [
            p for p in (config.data.train_path, config.data.eval_path, *config.data.eval_sets.values()) if p
        ]
    if not paths:
        raise DataError("check-data: name one or more records files (or a --config with data paths)")
    check = check_records(list(dict.fromkeys(paths)), files=not args.no_images)
    lengths, model = None, args.model or (config.model.name_or_path if config is not None else "")
    if model and check.records:
        from vlm_grpoma.config import ModelConfig
        from vlm_grpoma.models.registry import load_adapter

        model_cfg = replace(config.model if config is not None else ModelConfig(), name_or_path=model)
        lengths = prompt_lengths(check, load_adapter(model_cfg))
        model = f"{model} (pixels {model_cfg.min_pixels}-{model_cfg.max_pixels}, {model_cfg.prompt_style} prompts)"
    print("\n".join(summary(check, lengths, model)))
    if config is not None and lengths is not None and lengths.total:
        r = config.rollout
        print(
            f"longest sequence: {max(lengths.total)} prompt + {r.max_thought_tokens} thought + "
            f"{r.max_answer_tokens} answer tokens = {max(lengths.total) + r.max_thought_tokens + r.max_answer_tokens}"
        )
    if check.errors:
        print(f"errors (first {min(len(check.errors), args.max_errors)} of {len(check.errors)}):")
        print("\n".join(f"  {e}" for e in check.errors[: args.max_errors]))
        raise DataError(
            f"{len(check.errors)} of {check.lines} record(s) failed the check; first: {check.errors[0]}"
        )
    return 0


__all__ = [
    "MAX_ASPECT_RATIO",
    "DataCheck",
    "PromptLengths",
    "check_record_files",
    "check_records",
    "main",
    "prompt_lengths",
    "summary",
]
