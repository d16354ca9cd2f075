"""Public dataset formats -> validated JSONL records (``vlm-grpoma convert --from FORMAT IN OUT``).

``OUT`` is the records file when it ends in ``.jsonl``, else a folder that receives ``records.jsonl``.
Images stay where they are: paths inside the output folder are written relative, others absolute.
Formats and their inputs are documented in each module: ``coco`` (instances JSON), ``refcoco`` (folder or
refs JSON), ``sharerobot`` (trajectory JSON), ``robopoint`` (LLaVA-style JSON), ``where2place`` (folder).
An optional ``args.image_root`` overrides where images are looked up (coco, refcoco, sharerobot, robopoint).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from vlm_grpoma.datasets.converters.coco import convert_coco
from vlm_grpoma.datasets.converters.common import ConvertError
from vlm_grpoma.datasets.converters.points import convert_robopoint, convert_where2place
from vlm_grpoma.datasets.converters.refcoco import convert_refcoco
from vlm_grpoma.datasets.converters.sharerobot import convert_sharerobot
from vlm_grpoma.datasets.jsonl import RecordError, write_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import CommandError

FORMATS = ("coco", "refcoco", "sharerobot", "robopoint", "where2place")


def output_path(out: str | Path) -> Path:
    out = Path(out)
    return out if out.suffix == ".jsonl" else out / "records.jsonl"


def convert(
    source_format: str, input_path: str | Path, output: str | Path, image_root: str | Path | None = None
) -> tuple[Path, list[Record], dict[str, int]]:
    """Convert ``input_path`` and write the records; returns (records file, records, counts)."""
    src, target = Path(input_path), output_path(output)
    root = Path(image_root) if image_root else None
    if not src.exists():
        raise ConvertError(f"{src}: input not found")
    if source_format == "coco":
        records, counts = convert_coco(src, root)
    elif source_format == "refcoco":
        records, counts = convert_refcoco(src, root)
    elif source_format == "sharerobot":
        records, counts = convert_sharerobot(src, root)
    elif source_format == "robopoint":
        records, counts = convert_robopoint(src, root)
    elif source_format == "where2place":
        records, counts = convert_where2place(src, target.parent)
    else:
        raise ConvertError(f"unknown format {source_format!r}; choose one of {', '.join(FORMATS)}")
    if not records:
        raise ConvertError(f"{src}: nothing to convert ({counts})")
    return write_records(target, records), records, counts


def main(args: argparse.Namespace) -> int:
    try:
        path, records, counts = convert(
            args.source_format, args.input, args.output, getattr(args, "image_root", None)
        )
    except (ConvertError, RecordError) as err:
        raise CommandError(str(err)) from None
    splits = Counter(r.split for r in records)
    print(f"wrote {len(records)} {records[0].task} records from {args.source_format} {args.input} to {path}")
    print(
        "  splits: "
        + ", ".join(f"{k}={v}" for k, v in sorted(splits.items()))
        + "; "
        + ", ".join(f"{k}={v}" for k, v in counts.items())
    )
    return 0


__all__ = ["FORMATS", "convert", "main", "output_path"]
