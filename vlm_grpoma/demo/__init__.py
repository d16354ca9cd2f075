"""``vlm-grpoma demo``: train a tiny Qwen2.5-VL on CPU with an SFT warm start then GRPO-MA, and report.

``--task manipulation`` (the default, :mod:`vlm_grpoma.demo.manipulation`) shows held-out SAPIEN success rising
under GRPO-MA; ``--task detection`` (:mod:`vlm_grpoma.demo.detection`) runs the same pipeline on synthetic shapes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlm_grpoma.errors import CommandError


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma demo`` handler: output under ``--out`` (default ``runs/demo/<task>``)."""
    if args.seed < 0:
        raise CommandError(f"--seed must be >= 0, got {args.seed}")
    out = Path(args.out or f"runs/demo/{args.task}")
    if args.task == "manipulation":
        from vlm_grpoma.demo.manipulation import ManipulationPlan, run_manipulation_demo

        run_manipulation_demo(out, ManipulationPlan.quick() if args.quick else ManipulationPlan(), args.seed)
    elif args.task == "detection":
        from vlm_grpoma.demo.detection import DetectionPlan, run_detection_demo

        run_detection_demo(out, DetectionPlan.quick() if args.quick else DetectionPlan(), args.seed)
    else:
        raise CommandError(f"--task {args.task!r}: choose manipulation or detection")
    return 0
