"""The public formats ``vlm-grpoma convert --from FORMAT`` reads: name -> converter and what it reads.

A plain table (no converter is imported until used), so the CLI lists the formats instantly. Every converter
is a function ``(ConvertInputs) -> Converted`` in its own module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    """One public format: its converter (``module:function``), for ``--help`` what INPUT is, and whether the
    user maps its columns (``--task``, ``--field``, ``--box-format``)."""

    converter: str
    reads: str
    column_mapped: bool = False


FORMATS: dict[str, Format] = {
    "coco": Format("vlm_grpoma.datasets.converters.coco:convert_coco", "COCO instances JSON -> detection"),
    "refcoco": Format(
        "vlm_grpoma.datasets.converters.refcoco:convert_refcoco",
        "RefCOCO/+/g folder or refs JSON -> detection (referring)",
    ),
    "sharerobot": Format(
        "vlm_grpoma.datasets.converters.sharerobot:convert_sharerobot",
        "ShareRobot trajectory JSON -> trajectory",
    ),
    "robopoint": Format(
        "vlm_grpoma.datasets.converters.robopoint:convert_robopoint",
        "RoboPoint / LLaVA-style JSON (one image or several: multi-image, history frames) -> affordance",
    ),
    "where2place": Format(
        "vlm_grpoma.datasets.converters.where2place:convert_where2place",
        "Where2Place folder -> affordance with masks",
    ),
    "parquet": Format(
        "vlm_grpoma.datasets.converters.parquet:convert_parquet",
        "parquet file or folder (e.g. a Hugging Face datasets download) -> any grounding task, columns "
        "named with --task and --field",
        column_mapped=True,
    ),
    "gsm8k": Format(
        "vlm_grpoma.datasets.converters.math_parquet:convert_gsm8k",
        "GSM8K-style parquet (question, answer ending '#### N') -> answer (numeric), the worked solution as "
        "the reference thought",
        column_mapped=True,
    ),
    "math": Format(
        "vlm_grpoma.datasets.converters.math_parquet:convert_math",
        "MATH-style parquet (problem, solution with \\boxed{...}) -> answer, the solution as the reference "
        "thought",
        column_mapped=True,
    ),
}


def converter(name: str) -> Callable[[Any], Any]:
    """The converter function of format ``name``."""
    module, function = FORMATS[name].converter.split(":")
    return getattr(importlib.import_module(module), function)
