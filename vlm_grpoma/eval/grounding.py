"""Grounding evaluation (CLI ``eval``): run a model over a split, score its answers with
:mod:`~vlm_grpoma.eval.grounding_metrics` and write the files of :mod:`~vlm_grpoma.eval.grounding_report`."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlm_grpoma.config import RolloutConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.eval.grounding_metrics import (
    GROUNDING_TASKS,
    SCORERS,
    EvalReport,
    Prediction,
    score_predictions,
)
from vlm_grpoma.eval.grounding_report import markdown_report, write_report


def sampling_params(rollout: RolloutConfig, greedy: bool, samples: int, seed: int):
    """K = ``samples`` independent thought+answer completions per record (M = 1); greedy: K = 1, T = 0."""
    from vlm_grpoma.rollout.engine import SamplingParams

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if greedy and samples != 1:
        raise ValueError(
            f"greedy decoding gives one completion per record; got samples={samples} "
            "(use greedy=False to sample several)"
        )
    return SamplingParams(
        num_thoughts=samples,
        answers_per_thought=1,
        temperature=0.0 if greedy else rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_thought_tokens=rollout.max_thought_tokens,
        max_answer_tokens=rollout.max_answer_tokens,
        seed=seed,
    )


def generate_predictions(
    model: Any, adapter: Any, records: Sequence[Record], params: Any, batch_size: int = 8
) -> list[Prediction]:
    """Sample ``params.num_thoughts`` completions per record with the transformers engine, batch by batch."""
    from vlm_grpoma.rollout.hf import HFRolloutEngine

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    engine = HFRolloutEngine.for_adapter(model, adapter)
    out = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        tree = engine.sample(adapter.build_inputs(chunk), replace(params, seed=params.seed + start))
        completions = tree.completions()  # thought + answer: a real vocabulary can split a tag across them
        for b, record in enumerate(chunk):
            for k in range(params.num_thoughts):
                answer = adapter.parse_answer(completions[b][k][0], record)
                out.append(
                    Prediction(record, k, tree.thought_texts[b][k], tree.answer_texts[b][k][0], answer)
                )
    return out


def evaluate(
    model: Any,
    adapter: Any,
    records: Sequence[Record],
    *,
    greedy: bool = True,
    samples: int = 1,
    batch_size: int = 8,
    seed: int = 0,
    out_dir: str | Path | None = None,
    overlays: int = 16,
    rollout: RolloutConfig | None = None,
) -> EvalReport:
    """Run the model over ``records`` and score it; with ``out_dir`` also write the report files.

    ``rollout`` supplies the token budgets and, for sampled decoding, temperature / top-p / top-k (defaults:
    :class:`RolloutConfig`). The demo calls it in-process after each stage.
    """
    for record in records:
        if record.task not in SCORERS:
            raise ValueError(
                f"record {record.id}: task {record.task!r} is not a grounding task; "
                "evaluate manipulation with manip-eval"
            )
    start = time.perf_counter()
    params = sampling_params(rollout or RolloutConfig(), greedy, samples, seed)
    predictions = generate_predictions(model, adapter, records, params, batch_size)
    report = score_predictions(predictions, samples, greedy)
    report.seconds = time.perf_counter() - start
    if out_dir is not None:
        write_report(report, Path(out_dir), overlays)
    return report


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma eval --config X.yaml --checkpoint DIR --split S``; writes <output_dir>/eval-<split>/."""
    import torch

    from vlm_grpoma.datasets.jsonl import RecordError, read_records
    from vlm_grpoma.errors import CommandError
    from vlm_grpoma.models.loading import load_model

    config = args.config_obj
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_dir():
        raise CommandError(f"--checkpoint {checkpoint}: not a folder")
    if not config.data.eval_path:
        raise CommandError("data.eval_path: not set; point it at the JSONL records to evaluate")
    try:
        records = read_records(
            config.data.eval_path, skip_bad=config.data.skip_bad_records, check_images=True
        )
    except RecordError as err:
        raise CommandError(str(err)) from None
    in_split = [r for r in records if r.split == args.split]
    if not in_split:
        splits = ", ".join(sorted({r.split for r in records})) or "none"
        raise CommandError(
            f"--split {args.split}: no records in {config.data.eval_path} (splits there: {splits})"
        )
    chosen = [r for r in in_split if r.task in SCORERS]
    notes = []
    if len(chosen) < len(in_split):
        notes.append(f"{len(in_split) - len(chosen)} manipulation record(s) left out: use manip-eval")
    if not chosen:
        raise CommandError(f"--split {args.split}: no grounding records ({', '.join(GROUNDING_TASKS)})")
    samples = int(getattr(args, "samples", 1) or 1)
    out_dir = Path(config.logging.output_dir) / f"eval-{args.split}"
    loaded = load_model(replace(config.model, name_or_path=str(checkpoint)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = loaded.model.to(device).eval()
    print(
        f"evaluating {checkpoint} on {len(chosen)} {args.split} records "
        f"({'greedy' if samples == 1 else f'{samples} samples each'}) on {device}"
    )
    report = evaluate(
        model,
        loaded.adapter,
        chosen,
        greedy=samples == 1,
        samples=samples,
        seed=config.seed,
        rollout=config.rollout,
    )
    report.notes += notes
    meta = {"checkpoint": str(checkpoint), "split": args.split, "eval_path": config.data.eval_path}
    files = write_report(report, out_dir, int(getattr(args, "overlays", 16)), meta)
    print(markdown_report(report), end="")
    print(
        f"metrics: {files['metrics']}\nreport: {files['report']}\npredictions: {files['predictions']}\n"
        f"overlays: {len(files['overlays'])} PNG(s) in {out_dir / 'overlays'}"
    )
    return 0


__all__ = ["evaluate", "generate_predictions", "main", "sampling_params"]
