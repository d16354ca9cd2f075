"""vLLM backend: phase-2 cost with and without reading the prefix cache, on a tiny model (GPU only).

One colocated engine (``enable_prefix_caching=True``); the reference run sets ``skip_reading_prefix_cache`` on
the phase-2 requests, so the M answers of a thought recompute image + prompt + thought instead of reusing its
KV blocks. Every thought and answer runs to its budget (``ignore_stop``), so both runs do the same work; the
prefix cache is reset before every rollout. Prints a skip line and exits 0 without CUDA or vLLM. Example::

    .venv/bin/python benchmarks/rollout_vllm.py --preset bench --prompts 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

CONFIGS = ((4, 1), (4, 4), (8, 2), (4, 8))


def skip_reason() -> str | None:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'vlm-grpoma[vllm]')"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2_5_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout (B)")
    parser.add_argument("--thought", type=int, default=128, help="thought tokens (forced)")
    parser.add_argument("--answer", type=int, default=16, help="answer tokens (forced)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = parser.parse_args()
    if reason := skip_reason():
        print(f"SKIP benchmarks/rollout_vllm.py: {reason}; nothing measured")
        return 0

    from rollout import make_records  # benchmarks/rollout.py (this script's folder is on sys.path)

    from vlm_grpoma.config import Config, ModelConfig, RolloutConfig
    from vlm_grpoma.models.loading import load_model
    from vlm_grpoma.models.tiny import build_tiny_model
    from vlm_grpoma.rollout.backends import build_rollout_engine
    from vlm_grpoma.rollout.engine import SamplingParams
    from vlm_grpoma.rollout.vllm import VLLMOptions

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(args.arch, Path(tmp) / "model", seed=0, preset=args.preset)
        model_cfg = ModelConfig(name_or_path=str(folder), dtype=args.dtype, max_pixels=112 * 112)
        loaded = load_model(model_cfg)
        loaded.model.cuda().eval()
        prompts = loaded.adapter.build_inputs(make_records(Path(tmp), args.prompts))
        options = VLLMOptions(gpu_memory_utilization=args.gpu_memory_utilization, dtype=args.dtype)
        config = Config(model=model_cfg, rollout=RolloutConfig(backend="vllm"))
        cached = build_rollout_engine(config, loaded.model, loaded.adapter, vllm_options=options)
        engines = {
            "cache": cached,
            "recompute": replace(cached, options=replace(options, reuse_prefix_cache=False)),
        }
        for k, m in CONFIGS:
            params = SamplingParams(
                num_thoughts=k,
                answers_per_thought=m,
                max_thought_tokens=args.thought,
                max_answer_tokens=args.answer,
                ignore_stop=True,
                seed=0,
            )
            runs: dict[str, list[dict]] = {name: [] for name in engines}
            for rep in range(args.repeats + 1):
                for name, engine in engines.items():
                    engine.llm.reset_prefix_cache()
                    start = time.perf_counter()
                    tree = engine.sample(prompts, params)
                    if rep:  # the first round warms up kernels and the multimodal cache
                        runs[name].append(
                            {"total": time.perf_counter() - start, **tree.seconds, **engine.stats}
                        )
            row = {"config": f"T{k}A{m}", "prompts": args.prompts}
            for name, results in runs.items():
                best = min(results, key=lambda r: r["answers"])
                row[f"{name}_phase2_s"] = best["answers"]
                row[f"{name}_total_s"] = min(r["total"] for r in results)
                row[f"{name}_cached_fraction"] = best["answer_cached_tokens"] / best["answer_prompt_tokens"]
            row["phase2_speedup"] = row["recompute_phase2_s"] / row["cache_phase2_s"]
            rows.append(row)
    print(
        f"{args.arch}/{args.preset} {args.dtype}, B={args.prompts}, thought {args.thought} / answer "
        f"{args.answer} tokens, best of {args.repeats}"
    )
    print(
        f"{'config':<8}{'phase-2 cache s':>16}{'recompute s':>13}{'speedup':>9}{'cached tok':>12}{'total s':>9}"
    )
    for r in rows:
        print(
            f"{r['config']:<8}{r['cache_phase2_s']:>16.4f}{r['recompute_phase2_s']:>13.4f}"
            f"{r['phase2_speedup']:>8.2f}x{r['cache_cached_fraction']:>12.2f}{r['cache_total_s']:>9.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
