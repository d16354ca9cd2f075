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
    model: Any, adapter: Any, records: Sequence[Record], params: Any, batch_size: int = 8, engine: Any = None
) -> list[Prediction]:
    """Sample ``params.num_thoughts`` completions per record, batch by batch, with ``engine`` (a rollout
    engine, e.g. vLLM's) or else the transformers engine on ``model``."""
    from vlm_grpoma.rollout.hf import HFRolloutEngine

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    engine = engine or HFRolloutEngine.for_adapter(model, adapter)
    out = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        tree = engine.sample(adapter.build_inputs(chunk), replace(params, seed=params.seed + start))
        completions = tree.completions()  # thought + answer: a real vocabulary can split a tag across them
        for b, record in enumerate(chunk):
            for k in range(params.num_thoughts):
                answer = adapter.parse_answer(completions[b][k][0], record)
                thought, answer_text = tree.thought_texts[b][k], tree.answer_texts[b][k][0]
                out.append(Prediction(record, k, thought, answer_text, answer, adapter.thought.opened))
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
    engine: Any = None,
) -> EvalReport:
    """Run the model over ``records`` and score it; with ``out_dir`` also write the report files.

    ``rollout`` supplies the token budgets and, for sampled decoding, temperature / top-p / top-k (defaults:
    :class:`RolloutConfig`); ``engine`` a rollout engine to sample with (default: transformers on ``model``).
    The demo calls it in-process after each stage.
    """
    for record in records:
        if record.task not in SCORERS:
            raise ValueError(
                f"record {record.id}: task {record.task!r} is not a grounding task; "
                "evaluate manipulation with manip-eval"
            )
    start = time.perf_counter()
    params = sampling_params(rollout or RolloutConfig(), greedy, samples, seed)
    predictions = generate_predictions(model, adapter, records, params, batch_size, engine)
    report = score_predictions(predictions, samples, greedy)
    report.seconds = time.perf_counter() - start
    if out_dir is not None:
        write_report(report, Path(out_dir), overlays)
    return report


def eval_splits(records: Sequence[Record], requested: str | None, train_split: str) -> list[str]:
    """``--split``: comma-separated split names; by default every split of the records except the training
    split (RefCOCO: val, testA, testB), in file order."""
    from vlm_grpoma.errors import CommandError

    present = list(dict.fromkeys(r.split for r in records))
    if requested:
        chosen = [s.strip() for s in requested.split(",") if s.strip()]
        missing = [s for s in chosen if s not in present]
        if missing or not chosen:
            raise CommandError(
                f"--split {requested}: no records of split {', '.join(missing) or '(none named)'} "
                f"(splits there: {', '.join(present) or 'none'})"
            )
        return chosen
    held_out = [s for s in present if s != train_split]
    if not held_out:
        raise CommandError(
            f"data.eval_path holds only the training split {train_split!r}; name another file or pass "
            f"--split {train_split} to score the training records"
        )
    return held_out


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma eval --checkpoint DIR [--config X.yaml] [--split S[,S...]]``; writes
    ``<output_dir>/eval-<split>/`` for each split."""
    from vlm_grpoma.datasets.jsonl import RecordError, read_records
    from vlm_grpoma.errors import CommandError
    from vlm_grpoma.eval.loading import eval_config, load_for_eval, model_folder
    from vlm_grpoma.models.record_checks import screen_records

    model_dir = model_folder(args.checkpoint)
    resolved = eval_config(model_dir, args.config, args.overrides)
    config = resolved.config
    print(f"config: {resolved.source}")
    if not config.data.eval_path:
        raise CommandError("data.eval_path: not set; point it at the JSONL records to evaluate")
    try:
        records = read_records(
            config.data.eval_path, skip_bad=config.data.skip_bad_records, check_images=True
        )
    except RecordError as err:
        raise CommandError(str(err)) from None
    splits = eval_splits(records, args.split, config.data.train_split)
    grounding = [r for r in records if r.task in SCORERS]
    if not grounding:
        raise CommandError(
            f"data.eval_path: no grounding records ({', '.join(GROUNDING_TASKS)}) in "
            f"{config.data.eval_path}; evaluate manipulation with manip-eval"
        )
    samples = int(getattr(args, "samples", 1) or 1)
    loaded = load_for_eval(model_dir, config)
    print(f"model: {loaded.describe()}")
    grounding = screen_records(
        grounding,
        loaded.adapter,
        config.data.max_prompt_tokens,
        source=f"data.eval_path {config.data.eval_path}",
        skip_bad=config.data.skip_bad_records,
    )
    screened = {id(r) for r in grounding}
    for split in splits:
        in_split = [r for r in records if r.split == split]
        chosen = [r for r in in_split if id(r) in screened]
        manipulation = sum(r.task not in SCORERS for r in in_split)
        unfit = len(in_split) - manipulation - len(chosen)  # left out by data.skip_bad_records
        if not chosen:
            print(
                f"{split}: no grounding records to score ({manipulation} manipulation: use manip-eval; "
                f"{unfit} the model cannot take)"
            )
            continue
        print(
            f"evaluating {len(chosen)} {split} records "
            f"({'greedy' if samples == 1 else f'{samples} samples each'})"
        )
        report = evaluate(
            loaded.model,
            loaded.adapter,
            chosen,
            greedy=samples == 1,
            samples=samples,
            seed=config.seed,
            rollout=config.rollout,
            engine=loaded.rollout,
        )
        if manipulation:
            report.notes.append(f"{manipulation} manipulation record(s) left out: use manip-eval")
        if unfit:
            report.notes.append(
                f"{unfit} record(s) the model cannot take left out (data.skip_bad_records): see the warning"
            )
        meta = {
            "checkpoint": str(model_dir),
            "split": split,
            "eval_path": config.data.eval_path,
            "config": resolved.source,
        }
        out_dir = Path(config.logging.output_dir) / f"eval-{split}"
        files = write_report(report, out_dir, int(getattr(args, "overlays", 16)), meta)
        print(markdown_report(report), end="")
        print(
            f"metrics: {files['metrics']}\nreport: {files['report']}\npredictions: {files['predictions']}\n"
            f"overlays: {len(files['overlays'])} PNG(s) in {out_dir / 'overlays'}"
        )
    return 0


__all__ = ["eval_splits", "evaluate", "generate_predictions", "main", "sampling_params"]
