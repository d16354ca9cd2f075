"""Synthetic datasets (``vlm-grpoma make-data``): coloured-shape scenes or SAPIEN renders (JSONL + images),
or text-only arithmetic with a verifiable answer."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path

from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.errors import CommandError
from vlm_grpoma.output_folder import writable_folder

#: The ``make-data`` options that size an arithmetic problem (``ArithmeticConfig`` fields).
ARITHMETIC_SIZES = ("steps", "max_operand", "max_value")


def _generate_sapien(task: str, n: int, out: Path, seed: int, split: str, args: argparse.Namespace) -> Path:
    try:
        from vlm_grpoma.datasets.synthetic.sapien import generate
    except ImportError as err:
        raise CommandError(
            f"the sapien source is not available ({err}); it needs the SAPIEN simulator "
            "(pip install 'sapien>=3.0.3,<3.1', Linux x86_64) and vlm_grpoma.datasets.synthetic."
            "sapien"
        ) from None
    return generate(
        task,
        n,
        out,
        seed,
        split,
        assets=getattr(args, "assets", None),
        split_file=getattr(args, "split_file", None),
        protocol=getattr(args, "protocol", None),
        views=_views(args),
    )


def _views(args: argparse.Namespace) -> tuple[str, ...]:
    """``--views``: the SAPIEN cameras each record shows (front alone by default)."""
    from vlm_grpoma.envs.sapien.views import parse_views

    try:
        return parse_views(getattr(args, "views", None) or "front")
    except ValueError as err:
        raise CommandError(f"--views: {err}") from None


def _generate_arithmetic(args: argparse.Namespace, out: Path) -> Path:
    """``--source arithmetic``: the ``--difficulty`` preset, overridden by ``--steps``, ``--max-operand`` and
    ``--max-value``."""
    from vlm_grpoma.datasets.synthetic.arithmetic import PRESETS, SPLIT_BUCKETS, generate_arithmetic

    if args.task != "answer":
        raise CommandError(f"--source arithmetic makes answer records, not {args.task}; use --task answer")
    difficulty = getattr(args, "difficulty", None) or "normal"
    if difficulty not in PRESETS:
        raise CommandError(
            f"--difficulty for arithmetic must be one of {', '.join(PRESETS)}, got {difficulty!r}"
        )
    if args.split not in SPLIT_BUCKETS:
        raise CommandError(
            f"--split for arithmetic must be one of {', '.join(SPLIT_BUCKETS)}, got {args.split!r}"
        )
    overrides = {
        name: getattr(args, name, None) for name in ARITHMETIC_SIZES if getattr(args, name, None) is not None
    }
    cfg = dataclasses.replace(PRESETS[difficulty], **overrides)
    try:
        cfg.validate()
    except ValueError as err:
        raise CommandError(f"--steps/--max-operand/--max-value: {err}") from None
    writable_folder(out, "--out")
    name = difficulty if not overrides else "custom"
    return generate_arithmetic(args.n, out, args.seed, args.split, cfg, name)


def main(args: argparse.Namespace) -> int:
    """Write ``args.n`` records of ``args.task`` from ``args.source`` to ``args.out``; print where and what."""
    if args.n <= 0:
        raise CommandError(f"--n must be a positive number of records, got {args.n}")
    if args.seed < 0:
        raise CommandError(f"--seed must be >= 0, got {args.seed}")
    if not str(args.split).strip():
        raise CommandError("--split must be a non-empty name")
    out = Path(args.out)
    sizes = [f"--{n.replace('_', '-')}" for n in ARITHMETIC_SIZES if getattr(args, n, None) is not None]
    if sizes and args.source != "arithmetic":
        raise CommandError(f"{sizes[0]} applies to --source arithmetic only")
    if args.source == "shapes":
        if (
            getattr(args, "assets", None)
            or getattr(args, "split_file", None)
            or getattr(args, "protocol", None)
            or getattr(args, "views", None)
        ):
            raise CommandError("--assets, --split-file, --protocol and --views apply to --source sapien only")
        from vlm_grpoma.datasets.synthetic.shapes import PRESETS, SHAPE_TASKS, generate_shapes

        if args.task not in SHAPE_TASKS:
            raise CommandError(
                f"--source shapes makes {', '.join(SHAPE_TASKS)}, not {args.task}; "
                "use --source sapien for manipulation"
            )
        difficulty = getattr(args, "difficulty", None) or "normal"
        if difficulty not in PRESETS:
            raise CommandError(f"--difficulty must be one of {sorted(PRESETS)}, got {difficulty!r}")
        writable_folder(out, "--out")  # before drawing, not when the records are written
        path = generate_shapes(args.task, args.n, out, args.seed, args.split, PRESETS[difficulty])
    elif args.source == "arithmetic":
        path = _generate_arithmetic(args, out)
    elif args.source == "sapien":
        writable_folder(out, "--out")  # before rendering, not when the records are written
        path = _generate_sapien(args.task, args.n, out, args.seed, args.split, args)
    else:
        raise CommandError(f"unknown --source {args.source!r}; choose shapes, sapien or arithmetic")
    records = read_records(path)  # re-read: what we report is what a trainer will load
    kinds = Counter(type(r.ground_truth).__name__ for r in records)
    splits = Counter(r.split for r in records)
    print(f"wrote {len(records)} {args.task} records ({args.source}, seed {args.seed}) to {path}")
    print(
        "  splits: "
        + ", ".join(f"{k}={v}" for k, v in sorted(splits.items()))
        + "; ground truth: "
        + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        + (f"; images in {path.parent / 'images'}" if any(r.image for r in records) else "; text only")
    )
    return 0


__all__ = ["main"]
