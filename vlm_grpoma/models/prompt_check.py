"""``vlm-grpoma check-data``: the dataset check of :mod:`~vlm_grpoma.datasets.check`, plus, with a model, the
start-up screen training and eval apply (:mod:`~vlm_grpoma.models.record_checks`: special tokens in prompts,
``data.max_prompt_tokens``, image resize) and the prompt length each remaining record becomes for the model's
processor (chat template, instruction and image tokens), as training builds it.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vlm_grpoma.datasets.check import DataCheck, check_records, summary
from vlm_grpoma.datasets.images import ImageLoadError
from vlm_grpoma.errors import DataError
from vlm_grpoma.models.record_checks import prompt_problems

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter


@dataclass(frozen=True)
class PromptLengths:
    """Prompt tokens (chat template, instruction and image tokens) of each record for one model's processor."""

    total: list[int]
    image: list[int]


def prompt_lengths(check: DataCheck, adapter: QwenVLAdapter, max_tokens: int = 0) -> PromptLengths:
    """Screen the passing records as training does (:func:`prompt_problems` with ``max_tokens``, 0: no limit),
    then tokenise the rest as training does (``adapter.build_inputs``); a record the screen or the processor
    refuses moves from ``check.records`` to ``check.errors``."""
    total, image, kept, where = [], [], [], []
    image_pad = adapter.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    problems = prompt_problems(check.records, adapter, max_tokens)
    for index, (record, place) in enumerate(zip(check.records, check.where)):
        if index in problems:
            check.errors.append(f"{place} (id {record.id}): {problems[index]}")
            continue
        try:
            (inputs,) = adapter.build_inputs([record])
        except (ValueError, ImageLoadError) as err:
            check.errors.append(f"{place}: {err}")
            continue
        total.append(int(inputs.input_ids.numel()))
        image.append(int((inputs.input_ids == image_pad).sum()))
        kept.append(record)
        where.append(place)
    check.records, check.where = kept, where
    return PromptLengths(total, image)


def _spread(values: Sequence[float]) -> str:
    return f"min {min(values)}, median {statistics.median(values):g}, max {max(values)}"


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma check-data RECORDS... [--model M] [--config C]``; exit code 1 when any record is bad."""
    config = getattr(args, "config_obj", None)
    paths = list(args.records)
    if not paths and config is not None:
        paths = [
            p for p in (config.data.train_path, config.data.eval_path, *config.data.eval_sets.values()) if p
        ]
    if not paths:
        raise DataError("check-data: name one or more records files (or a --config with data paths)")
    check = check_records(list(dict.fromkeys(paths)), files=not args.no_images)
    print("\n".join(summary(check)), flush=True)  # the records first: the model may fail to load
    lines = []
    model = args.model or (config.model.name_or_path if config is not None else "")
    if model and check.records:
        from vlm_grpoma.config import DataConfig, ModelConfig
        from vlm_grpoma.models.prompts import prompt_text
        from vlm_grpoma.models.registry import load_adapter

        model_cfg = replace(config.model if config is not None else ModelConfig(), name_or_path=model)
        max_tokens = (config.data if config is not None else DataConfig()).max_prompt_tokens
        adapter = load_adapter(model_cfg)
        if config is not None:  # the run's own prompt text counts too
            adapter.prompt_text = prompt_text(config.data)
        before = len(check.errors)
        lengths = prompt_lengths(check, adapter, max_tokens)
        if len(check.errors) > before:  # the summary above counted them valid: say what is left
            lines.append(
                f"records: {len(check.records)} valid of {check.lines} read, {len(check.errors)} with errors "
                f"(after {model}'s checks: prompt length, special tokens, image resize)"
            )
        if lengths.total:
            lines.append(
                f"prompt tokens for {model} (pixels {model_cfg.min_pixels}-{model_cfg.max_pixels}, "
                f"{model_cfg.prompt_style} prompts): {_spread(lengths.total)} (image tokens "
                f"{_spread(lengths.image)})"
            )
            if config is not None:
                r = config.rollout
                longest = max(lengths.total) + r.max_thought_tokens + r.max_answer_tokens
                lines.append(
                    f"longest sequence: {max(lengths.total)} prompt + {r.max_thought_tokens} thought + "
                    f"{r.max_answer_tokens} answer tokens = {longest}"
                )
    if lines:
        print("\n".join(lines))
    if check.errors:
        print(f"errors (first {min(len(check.errors), args.max_errors)} of {len(check.errors)}):")
        print("\n".join(f"  {e}" for e in check.errors[: args.max_errors]))
        raise DataError(
            f"{len(check.errors)} of {check.lines} record(s) failed the check; first: {check.errors[0]}"
        )
    return 0


__all__ = ["PromptLengths", "main", "prompt_lengths"]
