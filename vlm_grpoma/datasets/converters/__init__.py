"""Public dataset formats -> validated JSONL records (``vlm-grpoma convert --from FORMAT IN OUT``).

``OUT`` is the records file when it ends in ``.jsonl``, else a folder that receives ``records.jsonl``.
Images stay where they are: paths inside the output folder are written relative, others absolute.
The formats are listed in :mod:`~vlm_grpoma.datasets.converters.registry`, each documented in its module.
An optional image root overrides where a format looks for its images.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from vlm_grpoma.datasets.converters.common import ConvertError, ConvertInputs
from vlm_grpoma.datasets.converters.registry import FORMATS, converter
from vlm_grpoma.datasets.jsonl import write_records
from vlm_grpoma.datasets.schema import Record


def output_path(out: str | Path) -> Path:
    out = Path(out)
    return out if out.suffix == ".jsonl" else out / "records.jsonl"


def convert(
    source_format: str,
    input_path: str | Path,
    output: str | Path,
    image_root: str | Path | None = None,
    *,
    task: str | None = None,
    fields: dict[str, str] | None = None,
    box_format: str = "xyxy",
) -> tuple[Path, list[Record], dict[str, int]]:
    """Convert ``input_path`` and write the records; returns (records file, records, counts).

    ``task``, ``fields`` (record field -> column) and ``box_format`` are for column-mapped formats only."""
    src, target = Path(input_path), output_path(output)
    if source_format not in FORMATS:
        raise ConvertError(f"unknown format {source_format!r}; choose one of {', '.join(FORMATS)}")
    if not FORMATS[source_format].column_mapped and (task or fields or box_format != "xyxy"):
        mapped = ", ".join(name for name, f in FORMATS.items() if f.column_mapped)
        raise ConvertError(f"--task, --field and --box-format apply to --from {mapped} only")
    if not src.exists():
        raise ConvertError(f"{src}: input not found")
    inputs = ConvertInputs(
        src, Path(image_root) if image_root else None, target.parent, task, dict(fields or {}), box_format
    )
    converted = converter(source_format)(inputs)
    if not converted.records:
        raise ConvertError(f"{src}: nothing to convert ({converted.counts})")
    return write_records(target, converted.records), converted.records, converted.counts


def parse_fields(pairs: list[str] | None) -> dict[str, str]:
    """``--field NAME=COLUMN`` arguments as a dict (one line naming a malformed one)."""
    fields = {}
    for pair in pairs or []:
        name, sep, column = pair.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ConvertError(f"--field {pair}: write NAME=COLUMN, e.g. --field prompt=question")
        fields[name.strip()] = column.strip()
    return fields


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma convert`` handler: convert, then print where the records went and what they are."""
    path, records, counts = convert(
        args.source_format,
        args.input,
        args.output,
        args.image_root,
        task=args.task,
        fields=parse_fields(args.field),
        box_format=args.box_format,
    )
    splits = Counter(r.split for r in records)
    print(f"wrote {len(records)} {records[0].task} records from {args.source_format} {args.input} to {path}")
    print(
        "  splits: "
        + ", ".join(f"{k}={v}" for k, v in sorted(splits.items()))
        + "; "
        + ", ".join(f"{k}={v}" for k, v in counts.items())
    )
    return 0


__all__ = ["convert", "main", "output_path", "parse_fields"]
