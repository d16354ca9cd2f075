"""``vlm-grpoma`` entry point: the subcommand table, and the one place that turns errors into exit codes.

Each subcommand's arguments are declared here; its implementation lives in the module that owns the work
and is imported only when the command runs, so ``vlm-grpoma --help`` and config errors stay instant.
Library code raises :mod:`vlm_grpoma.errors`; :func:`main` prints a :class:`~vlm_grpoma.errors.UserError` as
one line and returns 1, on every rank, whether started as the console script or ``python -m vlm_grpoma.cli``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from vlm_grpoma import __version__
from vlm_grpoma.config import load_config, validate
from vlm_grpoma.datasets.converters.registry import FORMATS
from vlm_grpoma.datasets.schema import TASKS
from vlm_grpoma.errors import UserError
from vlm_grpoma.models.families import ARCHS


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    handler: str  # "module:function", called with the parsed argparse namespace, returns an exit code
    add_arguments: Callable[[argparse.ArgumentParser], None]


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML run config")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rollout.num_thoughts=4"
    )


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        choices=("manipulation", "detection"),
        default="manipulation",
        help="manipulation: SAPIEN contact actions, success on seen/unseen objects (shows GRPO-MA working); "
        "detection: synthetic shapes boxes (shows the pipeline)",
    )
    p.add_argument("--out", default=None, help="output folder (default runs/demo/<task>); caches data there")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, data and training")
    p.add_argument("--quick", action="store_true", help="a smoke-test sized demo (seconds, learns nothing)")


def _eval_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (Hugging Face format)")
    p.add_argument("--split", default="test")
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        help="1 = greedy; N > 1 samples N completions per record at rollout.temperature",
    )
    p.add_argument(
        "--overlays", type=int, default=16, help="PNG overlays to draw (prediction vs ground truth)"
    )


def _manip_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=("model", "oracle", "random"), required=True)
    p.add_argument("--split", choices=("seen", "unseen"), required=True)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--out", required=True, help="result JSON path")
    p.add_argument("--checkpoint", default="", help="model checkpoint (for --policy model)")
    p.add_argument(
        "--config",
        default=None,
        help="the run config the checkpoint was trained with (model pixel bounds, prompt style, budgets)",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of --config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, help="simulator processes (0 = one per core)")


def _make_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--source", choices=("shapes", "sapien"), required=True)
    p.add_argument("--n", type=int, required=True, help="number of records")
    p.add_argument("--out", required=True, help="output folder (records.jsonl + images/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train")
    p.add_argument(
        "--difficulty",
        choices=("easy", "normal"),
        default="normal",
        help="shapes only: easy = 112px, one or two shapes (the CPU demo's level)",
    )


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="source_format",
        required=True,
        choices=tuple(FORMATS),
        help="; ".join(f"{name}: {fmt.reads}" for name, fmt in FORMATS.items()),
    )
    p.add_argument("input", help="the dataset file or folder in that format")
    p.add_argument("output", help="records file (*.jsonl) or a folder that receives records.jsonl")
    p.add_argument(
        "--image-root", default=None, help="folder holding the images (default: where the format keeps them)"
    )


def _tiny_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=ARCHS, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--preset",
        choices=("tiny", "small", "bench"),
        default="tiny",
        help="tiny: fastest (tests); small: learns the shapes task on CPU; bench: larger, for benchmarks",
    )


def _env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--no-probe", action="store_true", help="skip the DeepSpeed/SAPIEN functional probes")


COMMANDS: tuple[Command, ...] = (
    Command(
        "demo", "train the built-in demo on CPU in minutes and report", "vlm_grpoma.demo:main", _demo_args
    ),
    Command(
        "train",
        "train with GRPO-MA (one process per rank under the deepspeed launcher)",
        "vlm_grpoma.trainer.grpo_ma:main",
        _config_args,
    ),
    Command(
        "sft",
        "supervised warm start on ground-truth answers",
        "vlm_grpoma.trainer.sft:main",
        _config_args,
    ),
    Command(
        "eval",
        "grounding metrics and overlays for a checkpoint",
        "vlm_grpoma.eval.grounding:main",
        _eval_args,
    ),
    Command(
        "manip-eval",
        "manipulation success per category on seen/unseen objects",
        "vlm_grpoma.eval.manipulation:main",
        _manip_eval_args,
    ),
    Command(
        "make-data",
        "write a synthetic dataset (JSONL + images)",
        "vlm_grpoma.datasets.synthetic:main",
        _make_data_args,
    ),
    Command(
        "convert",
        "convert a public dataset format to JSONL records",
        "vlm_grpoma.datasets.converters:main",
        _convert_args,
    ),
    Command(
        "make-tiny-model",
        "build a tiny Qwen-VL model + processor offline",
        "vlm_grpoma.models.tiny:main",
        _tiny_model_args,
    ),
    Command(
        "env",
        "versions, devices, DeepSpeed ops, SAPIEN physics/render availability",
        "vlm_grpoma.env_report:main",
        _env_args,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlm-grpoma", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"vlm-grpoma {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def _resolve(command: Command) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = command.handler.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Command = args._command
    try:
        if getattr(args, "config", None) is not None:
            # Validate before anything heavy: the world size comes from the launcher's environment.
            args.config_obj = load_config(args.config, args.overrides)
            validate(args.config_obj, world_size=int(os.environ.get("WORLD_SIZE", "1")))
        return int(_resolve(command)(args) or 0)
    except UserError as err:
        print(f"vlm-grpoma {command.name}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
