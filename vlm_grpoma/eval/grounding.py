"""Grounding and short-answer evaluation (CLI ``eval``): run a model over a split, score its answers with
:mod:`~vlm_grpoma.eval.grounding_metrics` and write the files of :mod:`~vlm_grpoma.eval.grounding_report`."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlm_grpoma.config import RolloutConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.eval.grounding_metrics import (
    EVAL_TASKS,
    SCORERS,
    EvalReport,
    Prediction,
    score_predictions,
)
from vlm_grpoma.eval.grounding_report import (
    check_output_folder,
    markdown_report,
    summary,
    summary_markdown,
    write_report,
    write_summary,
)
from vlm_grpoma.eval.sampled_metrics import add_sampled_metrics
from vlm_grpoma.run_layout import CHECKPOINTS_DIR, STEP_PREFIX, eval_dir_name, eval_summary_name, step_of
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.base import RolloutEngine


def _sample_batch(
    engine: RolloutEngine, adapter: QwenVLAdapter, chunk: Sequence[Record], params: SamplingParams, start: int
) -> list[Prediction]:
    """The predictions of one batch, sampled with the seed its position gives it (``seed + start``)."""
    tree = engine.sample(adapter.build_inputs(chunk), replace(params, seed=params.seed + start))
    completions = tree.completions()  # thought + answer: a real vocabulary can split a tag across them
    out = []
    for b, record in enumerate(chunk):
        for k in range(params.num_thoughts):
            answer = adapter.parse_answer(completions[b][k][0], record)
            thought, answer_text = tree.thought_texts[b][k], tree.answer_texts[b][k][0]
            out.append(Prediction(record, k, thought, answer_text, answer, adapter.thought.opened))
    return out


def generate_predictions(
    model: Any,
    adapter: QwenVLAdapter,
    records: Sequence[Record],
    params: SamplingParams,
    batch_size: int = 8,
    engine: RolloutEngine | None = None,
    shard: tuple[int, int] = (0, 1),
) -> list[Prediction]:
    """Sample ``params.num_thoughts`` completions per record, batch by batch, with ``engine`` (a rollout
    engine, e.g. vLLM's) or else the transformers engine on ``model``.

    ``shard=(rank, world)`` (data-parallel eval under the launcher): batch ``i`` runs on rank ``i % world``
    with the seed one process gives it, every rank makes the same number of sampling calls (a rank short of
    batches repeats its last and drops the copy, so engines with collectives stay in step), and the batches
    are gathered: every rank returns exactly the predictions one process would, in record order.
    """
    from vlm_grpoma.rollout.hf import HFRolloutEngine

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    engine = engine or HFRolloutEngine.for_adapter(model, adapter)
    rank, world = shard
    starts = list(range(0, len(records), batch_size))
    mine: dict[int, list[Prediction]] = {}
    for i in range(rank, -(-len(starts) // world) * world, world):
        start = starts[min(i, len(starts) - 1)]
        predictions = _sample_batch(engine, adapter, records[start : start + batch_size], params, start)
        if i < len(starts):
            mine[start] = predictions
    if world > 1:
        import torch.distributed

        gathered: list[dict[int, list[Prediction]]] = [{} for _ in range(world)]
        torch.distributed.all_gather_object(gathered, mine)
        mine = {start: p for part in gathered for start, p in part.items()}
    return [p for start in starts for p in mine[start]]


def evaluate(
    model: Any,
    adapter: QwenVLAdapter,
    records: Sequence[Record],
    *,
    greedy: bool = True,
    samples: int = 1,
    batch_size: int = 8,
    seed: int = 0,
    out_dir: str | Path | None = None,
    overlays: int = 16,
    rollout: RolloutConfig | None = None,
    engine: RolloutEngine | None = None,
    shard: tuple[int, int] = (0, 1),
    answer_matcher: str = "exact",
) -> EvalReport:
    """Run the model over ``records`` and score it; with ``out_dir`` also write the report files.

    ``rollout`` supplies the token budgets and, for sampled decoding, temperature / top-p / top-k (defaults:
    :class:`RolloutConfig`); ``engine`` a rollout engine to sample with (default: transformers on ``model``);
    ``shard`` this rank's place when ranks share the records (see :func:`generate_predictions`);
    ``answer_matcher`` the short answers' matcher where a record names none. The demo calls it in-process
    after each stage.
    """
    for record in records:
        if record.task not in SCORERS:
            raise ValueError(
                f"record {record.id}: task {record.task!r} is not evaluated here ({', '.join(EVAL_TASKS)}); "
                "evaluate manipulation with manip-eval"
            )
    start = time.perf_counter()
    params = SamplingParams.from_config(rollout or RolloutConfig(), seed, greedy=greedy, samples=samples)
    predictions = generate_predictions(model, adapter, records, params, batch_size, engine, shard)
    report = score_predictions(predictions, samples, greedy, answer_matcher)
    add_sampled_metrics(report)
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


def checkpoint_step(model_dir: Path) -> int | None:
    """The training step of a ``checkpoints/step-N/model`` folder (or its step folder); None for another."""
    for folder in (model_dir, model_dir.parent):
        step = step_of(folder.name) if folder.name.startswith(STEP_PREFIX) else None
        if step is not None and folder.parent.name == CHECKPOINTS_DIR:
            return step
    return None


@dataclass(frozen=True)
class EvalLayout:
    """Where one ``eval`` writes: a folder per split and the summary across splits."""

    root: Path
    split_dirs: dict[str, Path]
    summary: Path


def eval_layout(out: str | None, output_dir: str, step: int | None, splits: Sequence[str]) -> EvalLayout:
    """``--out DIR``: ``DIR/<split>/`` and ``DIR/summary.json``; by default ``<output_dir>/eval-<split>-step-N/``
    and ``<output_dir>/eval-summary-step-N.json`` (no ``-step-N`` for a model folder outside a run), so two
    checkpoints of one run never write the same folder."""
    if out:
        root = Path(out)
        return EvalLayout(root, {s: root / s for s in splits}, root / "summary.json")
    root = Path(output_dir)
    return EvalLayout(
        root, {s: root / eval_dir_name(s, step) for s in splits}, root / eval_summary_name(step)
    )


def _answer_matcher(config: Any) -> str:
    """The short answers' default matcher: the run's ``rewards.options.answer_match.matcher``, else exact."""
    from vlm_grpoma.datasets.schema import MATCHERS
    from vlm_grpoma.errors import ConfigError

    matcher = config.rewards.options.get("answer_match", {}).get("matcher", "exact")
    if matcher not in MATCHERS:
        raise ConfigError(
            f"rewards.options.answer_match.matcher: must be one of {', '.join(MATCHERS)}, got {matcher!r}"
        )
    return matcher


def _join_ranks(config: Any) -> tuple[int, int]:
    """(rank, world size): under the launcher (``WORLD_SIZE`` > 1) the ranks join a process group and share
    the records batch by batch; a lone process is (0, 1)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from vlm_grpoma.distributed import init_distributed

    dist = init_distributed(config.deepspeed.dist_backend, config.train.dist_timeout_s)
    return dist.rank, dist.world_size


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma eval --checkpoint DIR [--config X.yaml] [--split S[,S...]] [--out DIR] [--samples K]``;
    writes a folder per split and a summary across them (:func:`eval_layout`)."""
    from vlm_grpoma.datasets.jsonl import RecordError, read_records
    from vlm_grpoma.errors import CommandError, ConfigError, DataError
    from vlm_grpoma.eval.loading import eval_config, load_for_eval, model_folder
    from vlm_grpoma.models.prompts import prompt_text
    from vlm_grpoma.models.record_checks import screen_records
    from vlm_grpoma.models.registry import load_adapter

    samples = int(getattr(args, "samples", 1))
    if samples < 1:
        raise CommandError(f"--samples {samples}: must be >= 1 (1 = greedy, K > 1 = K sampled answers)")
    model_dir = model_folder(args.checkpoint)
    resolved = eval_config(model_dir, args.config, args.overrides)
    config = resolved.config
    print(f"config: {resolved.source}")
    if not config.data.eval_path:
        raise ConfigError("data.eval_path: not set; point it at the JSONL records to evaluate")
    try:
        records = read_records(
            config.data.eval_path,
            skip_bad=config.data.skip_bad_records,
            check_images=True,
            image_root=config.data.image_root,
        )
    except RecordError as err:
        raise DataError(str(err)) from None
    splits = eval_splits(records, args.split, config.data.train_split)
    scorable = [r for r in records if r.task in SCORERS]
    if not scorable:
        raise DataError(
            f"data.eval_path: no records to evaluate ({', '.join(EVAL_TASKS)}) in "
            f"{config.data.eval_path}; evaluate manipulation with manip-eval"
        )
    matcher = _answer_matcher(config)
    step = checkpoint_step(model_dir)
    layout = eval_layout(getattr(args, "out", None), config.logging.output_dir, step, splits)
    check_output_folder(layout.root, "--out" if getattr(args, "out", None) else "logging.output_dir")
    shard = _join_ranks(config)
    main_rank = shard[0] == 0
    # the records this model cannot take, found with its processor alone: before the weights load
    adapter = load_adapter(replace(config.model, name_or_path=str(model_dir)))
    adapter.prompt_text = prompt_text(config.data)
    scorable = screen_records(
        scorable,
        adapter,
        config.data.max_prompt_tokens,
        source=f"data.eval_path {config.data.eval_path}",
        skip_bad=config.data.skip_bad_records,
    )
    loaded = load_for_eval(model_dir, config)
    print(f"model: {loaded.describe()}")
    screened = {id(r) for r in scorable}
    reports = {}
    for split in splits:
        in_split = [r for r in records if r.split == split]
        chosen = [r for r in in_split if id(r) in screened]
        manipulation = sum(r.task not in SCORERS for r in in_split)
        unfit = len(in_split) - manipulation - len(chosen)  # left out by data.skip_bad_records
        if not chosen:
            print(
                f"{split}: no records to score ({manipulation} manipulation: use manip-eval; "
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
            batch_size=config.train.eval_batch_prompts,
            seed=config.seed,
            rollout=config.rollout,
            engine=loaded.rollout,
            shard=shard,
            answer_matcher=matcher,
        )
        if not main_rank:  # every rank holds the gathered report; the first one writes it
            continue
        if manipulation:
            report.notes.append(f"{manipulation} manipulation record(s) left out: use manip-eval")
        if unfit:
            report.notes.append(
                f"{unfit} record(s) the model cannot take left out (data.skip_bad_records): see the warning"
            )
        meta = {
            "checkpoint": str(model_dir),
            "step": step,
            "split": split,
            "eval_path": config.data.eval_path,
            "config": resolved.source,
            "ranks": shard[1],
        }
        out_dir = layout.split_dirs[split]
        files = write_report(report, out_dir, int(getattr(args, "overlays", 16)), meta)
        print(markdown_report(report), end="")
        print(
            f"metrics: {files['metrics']}\nreport: {files['report']}\npredictions: {files['predictions']}\n"
            f"overlays: {len(files['overlays'])} PNG(s) in {out_dir / 'overlays'}"
        )
        reports[split] = report
    if reports:
        meta = {"checkpoint": str(model_dir), "step": step, "config": resolved.source, "samples": samples}
        payload = summary(reports, meta)
        print(f"\n# Summary over {', '.join(reports)}\n\n{summary_markdown(payload)}", end="")
        print(f"summary: {write_summary(payload, layout.summary)}")
    return 0


__all__ = [
    "EvalLayout",
    "checkpoint_step",
    "eval_layout",
    "eval_splits",
    "evaluate",
    "generate_predictions",
    "main",
]
