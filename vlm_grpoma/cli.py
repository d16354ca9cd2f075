"""``vlm-grpoma`` entry point: the subcommand table, and the one place that turns errors into exit codes.

Each subcommand's arguments are declared here; its implementation lives in the module that owns the work
and is imported only when the command runs, so ``vlm-grpoma --help`` and config errors stay instant.
Library code raises :mod:`vlm_grpoma.errors`; :func:`main` prints a :class:`~vlm_grpoma.errors.UserError` as
one line and returns 1, on every rank, whether started as the console script or ``python -m vlm_grpoma.cli``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vlm_grpoma import __version__
from vlm_grpoma.config import check_optional_dependencies, config_reference, load_config, validate
from vlm_grpoma.datasets.converters.registry import FORMATS
from vlm_grpoma.datasets.schema import TASKS
from vlm_grpoma.errors import DistributedError, UserError
from vlm_grpoma.models.families import ARCHS


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    handler: str  # "module:function", called with the parsed argparse namespace, returns an exit code
    add_arguments: Callable[[argparse.ArgumentParser], None]


class _IntermixedParser(argparse.ArgumentParser):
    """A subcommand parser whose positionals (config overrides) may sit between its flags:
    ``train train.steps=3 --config run.yaml seed=1`` parses as ``--config run.yaml train.steps=3 seed=1``."""

    _intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._intermixing:  # the two passes of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def config_keys_help() -> str:
    """Every config key with its default, type, range and doc line (the epilog of ``train/sft --help``)."""
    lines = ["config keys (set any as key=value, before or after the flags; default, type, range):"]
    for doc in config_reference():
        facts = ", ".join(part for part in (doc.type, doc.range) if part)
        lines.append(f"  {doc.key}={json.dumps(doc.default)}  ({facts})")
        lines.append(textwrap.fill(doc.doc, width=106, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = config_keys_help()
    p.add_argument("--config", required=True, help="YAML run config")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. rollout.num_thoughts=4 (the keys are listed below)",
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


def _eval_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="run config (default: the config.yaml the training run saved in its output folder, found from "
        "--checkpoint; without one, the defaults)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides of that config, e.g. data.eval_path=data/test.jsonl",
    )


def _checkpoint_help(what: str) -> str:
    return (
        f"{what}: a run folder (its newest checkpoint), a checkpoints/step-N folder or its model/ folder; "
        "full weights or a LoRA adapter"
    )


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help=_checkpoint_help("the model to evaluate"))
    _eval_config_args(p)
    p.add_argument(
        "--split",
        default=None,
        help="split(s) of data.eval_path to score, comma-separated (e.g. val,testA,testB); default: every "
        "split there except data.train_split",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        help="1 = greedy; K > 1 samples K completions per record at rollout.temperature and reports "
        "pass@k and best-of-K beside the mean",
    )
    p.add_argument(
        "--overlays", type=int, default=16, help="PNG overlays to draw (prediction vs ground truth)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="results folder: <out>/<split>/ per split and <out>/summary.json; default "
        "<output_dir>/eval-<split>-step-N/ and <output_dir>/eval-summary-step-N.json",
    )


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help=_checkpoint_help("the model to export"))
    p.add_argument("--out", required=True, help="the new folder (must not exist, or be empty)")
    p.add_argument(
        "--merge-lora",
        action="store_true",
        help="merge a LoRA checkpoint (and the adapters below it) into full weights; without it only an "
        "adapter on a hub model is exported as an adapter",
    )
    p.add_argument(
        "--base",
        default=None,
        help="the full model a LoRA checkpoint rests on, when the base its adapter_config.json records is "
        "not on this machine (a folder or hub id)",
    )


def _asset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--assets",
        default=None,
        help="a folder of PartNet-Mobility objects (<id>/mobility.urdf, meta.json, semantics.txt, "
        "mobility_v2.json); default: procedural objects",
    )
    p.add_argument(
        "--split-file",
        default=None,
        help="seen/unseen category split of --assets (JSON); default: ManipLLM's, shipped with the package",
    )
    p.add_argument(
        "--protocol",
        choices=("manipllm", "simple"),
        default=None,
        help="how actions are executed and judged; default: manipllm with --assets, simple without",
    )


def _manip_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        choices=("model", "oracle", "random"),
        required=True,
        help="model: a checkpoint's greedy answers; oracle: the demonstrated contact (upper bound); random: a "
        "uniform pixel (chance level)",
    )
    p.add_argument(
        "--split",
        choices=("seen", "unseen", "all"),
        default="all",
        help="seen: held-out instances of the training categories; unseen: held-out categories; all: both",
    )
    p.add_argument(
        "--episodes", type=int, default=100, help="episodes per split, round-robin over categories"
    )
    _asset_args(p)
    p.add_argument("--out", required=True, help="result JSON path (a .md table and a .png grid beside it)")
    p.add_argument("--checkpoint", default="", help=_checkpoint_help("for --policy model"))
    _eval_config_args(p)
    p.add_argument("--seed", type=int, default=0, help="episode sampling seed (same seed, same episodes)")
    p.add_argument(
        "--views",
        default=None,
        help="--policy model: the cameras the model sees each episode through, front first, e.g. front,wrist "
        "(those its training records showed: make-data --views); default front",
    )
    p.add_argument("--workers", type=int, default=0, help="simulator processes (0 = one per core)")
    p.add_argument(
        "--job-timeout",
        type=float,
        help="seconds one simulator job (sampling or executing an episode) may take before its worker is "
        "killed as frozen and replaced (default: the episode time limit + 60 s); a sampling job then runs "
        "again, an executed episode fails with reason timeout",
    )


def _make_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=TASKS, required=True, help="the task of the records to generate")
    p.add_argument(
        "--source",
        choices=("shapes", "sapien", "arithmetic"),
        required=True,
        help="shapes: coloured shapes on plain or noisy backgrounds; sapien: renders of the simulator's "
        "articulated objects (needs Vulkan rendering); arithmetic: text-only multi-step arithmetic "
        "(--task answer) with a stepwise reference thought",
    )
    p.add_argument("--n", type=int, required=True, help="number of records")
    p.add_argument("--out", required=True, help="output folder (records.jsonl + images/)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (same seed, same dataset)")
    p.add_argument(
        "--split",
        default="train",
        help="the split name written into every record (arithmetic: train, val or test, disjoint problems)",
    )
    p.add_argument(
        "--difficulty",
        choices=("easy", "normal", "relational", "hard"),
        default="normal",
        help="shapes: easy = 112px, one or two shapes (the CPU demo's level); relational = 112px, 3-6 "
        "shapes, a prompt that needs all of them and a reference thought that decides (detection). "
        "arithmetic: easy = 2 operations, operands <= 9; normal = 3, <= 9; hard = 5, <= 20 (values <= 99, "
        "99, 999)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="arithmetic: the number of operations (overrides --difficulty)",
    )
    p.add_argument(
        "--max-operand",
        type=int,
        default=None,
        help="arithmetic: the largest operand and start value (overrides --difficulty)",
    )
    p.add_argument(
        "--max-value",
        type=int,
        default=None,
        help="arithmetic: the largest value any step may reach, >= 2 x the largest operand (overrides "
        "--difficulty)",
    )
    p.add_argument(
        "--views",
        default=None,
        help="sapien: the cameras each record shows, front first (the ground truth's view), e.g. front,wrist "
        "(several images per record; train with model.max_images set to their count); default front",
    )
    _asset_args(p)


def _make_assets_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder (one <id>/ folder per object)")
    p.add_argument("--per-category", type=int, default=5, help="objects per procedural category")
    p.add_argument(
        "--seed", type=int, default=0, help="the seed of the procedural objects (same seed, same assets)"
    )
    p.add_argument("--categories", nargs="+", default=None, help="procedural categories (default: all)")


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="source_format",
        required=True,
        choices=tuple(FORMATS),
        help="; ".join(f"{name}: {fmt.reads}" for name, fmt in FORMATS.items()),
    )
    p.add_argument("input", help="the dataset file or folder in that format")
    p.add_argument(
        "output",
        help="records file (*.jsonl) or a folder that receives records.jsonl; every split goes into this one "
        "file (training reads data.train_split from it, eval the others)",
    )
    p.add_argument(
        "--image-root", default=None, help="folder holding the images (default: where the format keeps them)"
    )
    p.add_argument("--task", choices=TASKS, default=None, help="parquet: the task of the records to make")
    p.add_argument(
        "--field",
        action="append",
        metavar="NAME=COLUMN",
        help="parquet: the column holding a record field (repeat): prompt, image, boxes, points, trajectory, "
        "label, id, split; gsm8k, math: prompt, solution, id, split (defaults: the format's own columns)",
    )
    p.add_argument(
        "--box-format",
        choices=("xyxy", "xywh"),
        default="xyxy",
        help="parquet: boxes as [x1, y1, x2, y2] or COCO's [x, y, width, height]",
    )


def _check_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "records",
        nargs="*",
        metavar="RECORDS",
        help="records files (JSONL) to check; default with --config: data.train_path, data.eval_path and "
        "data.eval_sets",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model (hub id, folder or LoRA checkpoint) whose processor counts each record's prompt tokens; "
        "default with --config: model.name_or_path",
    )
    p.add_argument(
        "--config",
        default=None,
        help="run config: its pixel bounds, prompt style and token budgets (and data paths without RECORDS)",
    )
    p.add_argument("--max-errors", type=int, default=20, help="errors to print (all of them are counted)")
    p.add_argument(
        "--no-images", action="store_true", help="check the records only, without opening images and masks"
    )
    p.set_defaults(overrides=[])


def _tiny_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=ARCHS, required=True, help="the Qwen-VL family to build")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face model folder)")
    p.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed (same seed, same model)")
    p.add_argument(
        "--preset",
        choices=("tiny", "small", "bench", "window"),
        default="tiny",
        help="tiny: fastest (tests); small: learns the shapes task on CPU; bench: larger, for benchmarks; "
        "window: tiny with Qwen2.5-VL's real 112-px attention windows",
    )
    p.add_argument(
        "--real-vocab",
        action="store_true",
        help="the real Qwen2 tokenizer and 151,936-token embedding (needs the cached dashscope wheel)",
    )


def _plan_args(p: argparse.ArgumentParser) -> None:
    from vlm_grpoma.planning.assumptions import ASSUMPTIONS

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = (
        "Per-GPU memory of a run config before launching it: parameter counts from the model built on the "
        "meta device, model states, training pass, rollout, a verdict and the first knob to turn. Exit code 0 "
        "when it fits and the config agrees with its architecture, else 1.\n\nHow each part is estimated:\n"
        + ASSUMPTIONS
    )
    p.add_argument("config", help="YAML run config")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. model.lora.r=32")
    p.add_argument(
        "--gpus", type=int, default=None, help="GPUs per node (default: the config's # Hardware line, else 1)"
    )
    p.add_argument("--nodes", type=int, default=None, help="nodes (default: the # Hardware line, else 1)")
    p.add_argument(
        "--gpu-mem",
        type=float,
        default=None,
        help="memory per GPU in GB (default: the # Hardware line, else 80)",
    )


def _env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--no-probe", action="store_true", help="skip the DeepSpeed/SAPIEN functional probes")


def _fetch_mesa_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dest",
        default=None,
        help="target folder (default: <cache>/mesa, where SAPIEN finds it; the cache is $VLM_GRPOMA_CACHE, "
        "else ~/.cache/vlm-grpoma)",
    )


def _rollout_server_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "The engine is built from the run's config: model.* (checkpoint, dtype, pixel bounds), rollout.vllm.* "
        "(engine options, e.g. rollout.vllm.max_model_len=4096) and the log-prob mode; give the same --config "
        "the trainer runs with. One engine per server (tensor_parallel_size 1): start one per device and list "
        "them all in the trainer's rollout.server.urls. With a token (--token-file, or the config's "
        "rollout.server.token_file; the trainer names the same file) only signed requests are served; without "
        "one the server listens on this machine only (a --host other than loopback is refused)."
    )
    p.add_argument("--config", help="the run's YAML config (its model and rollout.vllm sections)")
    p.add_argument("--model", help="checkpoint folder or hub id (instead of the config's model.name_or_path)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8400, help="port to listen on (0: any free port, printed)")
    p.add_argument(
        "--token-file",
        help="file holding the shared secret (openssl rand -hex 32, chmod 600; instead of rollout.server.token_file)",
    )
    p.add_argument(
        "--stop-with",
        type=int,
        metavar="PID",
        help="stop serving once process PID ends (launch/train.sh passes itself: no server outlives a killed "
        "launcher)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted config overrides, e.g. rollout.vllm.dtype=bfloat16",
    )


def _launch_scripts_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", required=True, help="folder to write train.sh, slurm.sbatch, hostfile.example into"
    )
    p.add_argument("--force", action="store_true", help="overwrite files that already exist there")


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
        "export",
        "a checkpoint as a self-contained Hugging Face folder (weights, processor, chat template, generation "
        "config) for transformers and vLLM",
        "vlm_grpoma.eval.export:main",
        _export_args,
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
        "make-assets",
        "write procedural objects as PartNet-Mobility folders (for manip-eval/make-data --assets)",
        "vlm_grpoma.envs.sapien.partnet_export:main",
        _make_assets_args,
    ),
    Command(
        "convert",
        "convert a public dataset format to JSONL records",
        "vlm_grpoma.datasets.converters:main",
        _convert_args,
    ),
    Command(
        "check-data",
        "validate records, images and masks up front; counts, image sizes, prompt token lengths",
        "vlm_grpoma.models.prompt_check:main",
        _check_data_args,
    ),
    Command(
        "make-tiny-model",
        "build a tiny Qwen-VL model + processor offline",
        "vlm_grpoma.models.tiny:main",
        _tiny_model_args,
    ),
    Command(
        "plan",
        "will a config fit its GPUs? memory per GPU, verdict, first knob to turn",
        "vlm_grpoma.planning.report:main",
        _plan_args,
    ),
    Command(
        "env",
        "versions, devices, DeepSpeed ops, SAPIEN physics/render availability",
        "vlm_grpoma.env_report:main",
        _env_args,
    ),
    Command(
        "fetch-mesa",
        "fetch Mesa lavapipe (CPU Vulkan, Debian/Ubuntu apt) into the cache for SAPIEN rendering",
        "vlm_grpoma.envs.sapien.vulkan:fetch_main",
        _fetch_mesa_args,
    ),
    Command(
        "rollout-server",
        "serve rollouts from a vLLM engine on this device for trainers elsewhere (rollout.backend=vllm_server)",
        "vlm_grpoma.rollout.server.service:main",
        _rollout_server_args,
    ),
    Command(
        "launch-scripts",
        "write the multi-GPU / multi-node launchers (deepspeed, Slurm) into a folder",
        "vlm_grpoma.launch_scripts:main",
        _launch_scripts_args,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlm-grpoma",
        description="GRPO-MA training and evaluation of Qwen-VL models on grounding and manipulation. "
        "A run: check-data, sft, train, eval / manip-eval; `vlm-grpoma COMMAND --help` for each.",
    )
    parser.add_argument("--version", action="version", version=f"vlm-grpoma {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_IntermixedParser
    )
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
            check_optional_dependencies(args.config_obj, command.name)  # before any model loads
        return int(_resolve(command)(args) or 0)
    except UserError as err:
        message = " ".join(str(err).split())  # one line, whatever the library put in it
        # one write, newline included: under the launcher each rank's stderr may be unbuffered, and print()'s
        # separate write of the newline let two ranks' lines run together
        sys.stderr.write(f"vlm-grpoma {command.name}: error: {message}\n")
        sys.stderr.flush()
        if argv is None and isinstance(err, DistributedError):
            # The process group is broken: tearing it down at exit aborts (gloo) or hangs (NCCL).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
