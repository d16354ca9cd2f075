"""``vlm-grpoma plan CONFIG``: the model's counts, per-GPU memory by part, the verdict, the first knob to turn,
checkpoint sizes, and the config's problems against its architecture, as a printed table."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.config import Config
from vlm_grpoma.planning.checks import config_problems
from vlm_grpoma.planning.memory import (
    GIB,
    Hardware,
    Knob,
    MemoryPlan,
    estimate,
    first_knob,
    micro_batch_prompts,
    precision_of,
)
from vlm_grpoma.planning.model_stats import ModelStats, model_stats

#: A config's header line naming the GPUs it was written for, e.g. ``# Hardware: 8 GPUs x 80 GB`` or
#: ``# Hardware: 2 nodes x 8 GPUs x 80 GB``; ``plan`` uses it unless --gpus/--nodes/--gpu-mem say otherwise.
HARDWARE_LINE = re.compile(
    r"^#\s*Hardware:\s*(?:(\d+)\s*nodes?\s*x\s*)?(\d+)\s*GPUs?\s*x\s*(\d+(?:\.\d+)?)\s*GB", re.I | re.M
)
DEFAULT_HARDWARE = Hardware(gpus_per_node=1, nodes=1, gpu_mem_gb=80.0)


def header_hardware(path: str | Path) -> Hardware | None:
    """The hardware a config file's ``# Hardware:`` header line names, or None."""
    found = HARDWARE_LINE.search(Path(path).read_text())
    if found is None:
        return None
    nodes, gpus, memory = found.groups()
    return Hardware(gpus_per_node=int(gpus), nodes=int(nodes or 1), gpu_mem_gb=float(memory))


@dataclass(frozen=True)
class CheckpointSize:
    """Bytes one checkpoint writes: the Hugging Face folder and DeepSpeed's state (frozen parts left out)."""

    model: float
    deepspeed: float


def checkpoint_size(config: Config, stats: ModelStats, w: int) -> CheckpointSize:
    """``model/``: the adapter and trainable copies (LoRA) or the whole model, in the training dtype;
    ``deepspeed/``: the trainable weights (held in ZeRO-3's partitions instead) plus the optimizer, fp32
    master + two AdamW moments (12 B each; fp32 ZeRO-0 keeps no master copy: 8 B)."""
    t = stats.trainable
    lora_only = config.model.lora.enabled and not config.checkpoint.merge_lora
    model = w * (t if lora_only else stats.base_parameters)
    module = 0 if config.deepspeed.zero_stage == 3 else w * t
    optimizer = 8 * t if w == 4 and config.deepspeed.zero_stage == 0 else 12 * t
    return CheckpointSize(model=float(model), deepspeed=float(module + optimizer))


@dataclass
class PlanReport:
    """Everything ``plan`` prints."""

    config: Config
    stats: ModelStats
    hardware: Hardware
    hardware_source: str
    memory: MemoryPlan
    problems: list[str]
    knob: Knob | None
    checkpoint: CheckpointSize


def make_plan(config: Config, hardware: Hardware, hardware_source: str = "") -> PlanReport:
    """Count the model on the meta device, estimate the per-GPU memory, check the config, find the knob."""
    stats = model_stats(config)
    memory = estimate(config, stats, hardware)
    problems = config_problems(config, stats, memory.shapes, hardware.world_size)
    knob = None if memory.fits else first_knob(config, model_stats, hardware)
    w = 4 if precision_of(config, hardware.device) == "fp32" else 2
    return PlanReport(
        config, stats, hardware, hardware_source, memory, problems, knob, checkpoint_size(config, stats, w)
    )


def _gb(value: float) -> str:
    return f"{value / GIB:8.2f}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def format_report(report: PlanReport, name: str) -> str:
    """The printed plan: a header, the per-GPU memory table in GB (2^30 bytes), the verdict."""
    c, s, hw, mem = report.config, report.stats, report.hardware, report.memory
    lora = c.model.lora
    how = (
        f"LoRA r{lora.r} on {s.lora_targets} linear layers"
        if lora.enabled
        else "full fine-tuning of the language model"
    )
    vision = "vision frozen" if not s.trainable_vision else f"vision trained ({_count(s.trainable_vision)})"
    stage = c.deepspeed.zero_stage
    offload = ", optimizer offloaded to CPU" if c.deepspeed.offload_optimizer else ""
    shape = mem.shapes
    lines = [
        f"plan for {name}",
        f"  model        {c.model.name_or_path} ({s.source}), {s.family.model_type}, {mem.precision}",
        f"  parameters   {_count(s.base_parameters)}; trainable {_count(s.trainable)} "
        f"({100 * s.trainable / s.total:.1f} %): {how}; {vision}",
        f"  hardware     {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) x {hw.gpu_mem_gb:g} GB"
        f"{f' ({report.hardware_source})' if report.hardware_source else ''}; ZeRO-{stage}{offload}",
        f"  tokens       prompt <= {shape.prompt_tokens} ({shape.image_tokens} image), packed row "
        f"{shape.packed_row}, path row {shape.naive_row}; {shape.prompts_per_rank} prompts per GPU per step, "
        f"{micro_batch_prompts(c, shape)} per micro-batch"
        + (f" ({c.train.micro_batch_tokens}-token budget)" if c.train.micro_batch_tokens else ""),
        "",
        f"  {'per-GPU memory':<46}{'GB':>8}",
    ]
    for part, value in mem.states.items():
        lines.append(f"  {part:<46}{_gb(value)}")
    gc = "with" if c.model.gradient_checkpointing else "without"
    other = mem.train_peak_without_checkpointing if gc == "with" else mem.train_peak_with_checkpointing
    lines.append(
        f"  {f'training pass ({gc} gradient checkpointing)':<46}{_gb(sum(mem.training_pass.values()))}"
        f"   ({'without' if gc == 'with' else 'with'} it: {other / GIB:.2f})"
    )
    for part, value in mem.training_pass.items():
        lines.append(f"    {part:<44}{_gb(value)}")
    backend = {
        "hf": "transformers backend",
        "vllm": "vLLM weight sync",
        "vllm_server": "weight push to servers",
    }[c.rollout.backend]
    lines.append(f"  {f'rollout ({backend})':<46}{_gb(sum(mem.rollout.values()))}")
    for part, value in mem.rollout.items():
        lines.append(f"    {part:<44}{_gb(value)}")
    if c.rollout.backend == "vllm":
        lines.append(
            f"  {'vLLM share (weights + KV cache, not training)':<46}{_gb(mem.vllm_share)}"
            f"   (gpu_memory_utilization {c.rollout.vllm.gpu_memory_utilization:g})"
        )
    lines += [
        f"  {'CUDA context + fragmentation reserve':<46}{_gb(mem.reserve)}",
        f"  {'peak (states + max(pass, rollout) + reserve)':<46}{_gb(mem.total)}",
        f"  {'available to training':<46}{_gb(mem.available)}",
    ]
    if mem.cpu_offload_bytes:
        lines.append(f"  {'CPU memory for the offloaded optimizer (node)':<46}{_gb(mem.cpu_offload_bytes)}")
    lines.append("")
    if mem.fits:
        lines.append(f"verdict: fits, {mem.margin / GIB:.2f} GB to spare per GPU")
    else:
        lines.append(f"verdict: does not fit, short by {-mem.margin / GIB:.2f} GB per GPU")
        knob = report.knob
        if knob is None:
            lines.append("first knob: none of the knobs applies; use more or larger GPUs")
        else:
            result = "fits" if knob.plan.fits else f"still short by {-knob.plan.margin / GIB:.2f} GB"
            lines.append(
                f"first knob: {knob.override} -> peak {knob.plan.total / GIB:.2f} of "
                f"{knob.plan.available / GIB:.2f} GB ({result})"
            )
    ck = report.checkpoint
    keep = c.checkpoint.keep_last
    lines.append(
        f"checkpoint: model/ {ck.model / GIB:.2f} GB + deepspeed/ {ck.deepspeed / GIB:.2f} GB per save "
        f"(x checkpoint.keep_last {keep} = {keep * (ck.model + ck.deepspeed) / GIB:.2f} GB)"
    )
    lines += [f"note: {n}" for n in mem.notes]
    lines += [f"problem: {p}" for p in report.problems]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma plan`` handler: exit 0 when the config fits and has no problems, else 1."""
    header = header_hardware(args.config)
    base = header or DEFAULT_HARDWARE
    hardware = Hardware(
        gpus_per_node=args.gpus or base.gpus_per_node,
        nodes=args.nodes or base.nodes,
        gpu_mem_gb=args.gpu_mem or base.gpu_mem_gb,
    )
    flags = any(v is not None for v in (args.gpus, args.nodes, args.gpu_mem))
    source = "command line" if flags else "the config's # Hardware line" if header else "default"
    report = make_plan(args.config_obj, hardware, source)
    print(format_report(report, args.config))
    return 0 if report.memory.fits and not report.problems else 1
