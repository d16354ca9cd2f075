"""Does the thought decide? Held-out IoU of the answer decoded after the reference thought, after a wrong
thought (the same thought concluding on another object of the scene), and after the model's own thought.

For relational shapes records (``make-data --difficulty relational``): each answer is decoded greedily with its
thought forced as the start of the completion, so only the thought differs between the first two columns. A
model whose answers follow its thought scores high after the reference thought and low after the wrong one::

    .venv/bin/python benchmarks/thought_matters.py CHECKPOINT RECORDS.jsonl [--config C.yaml] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from vlm_grpoma.config import load_config
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.datasets.synthetic.relational import Choice, SceneObject, thought_text
from vlm_grpoma.eval.grounding import generate_predictions
from vlm_grpoma.models.base import collate
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rewards import Completion, build_reward
from vlm_grpoma.sampling import SamplingParams

ANSWER_TOKENS = 32


def wrong_choice(record: Record) -> int:
    """Another object of the scene for a wrong conclusion: the runner-up candidate, else the first other one."""
    choice = record.meta["choice"]
    others = [i for i in choice["candidates"] if i != choice["index"]]
    others += [i for i in range(len(record.meta["objects"])) if i != choice["index"]]
    return others[0]


def forced_thought(record: Record, chosen: int | None = None) -> str:
    """The record's reference thought, concluding on object ``chosen`` (default: the right one)."""
    objects = [
        SceneObject(o["kind"], o["colour"], o["size"], tuple(o["box"]), 0) for o in record.meta["objects"]
    ]
    choice = Choice(**{**record.meta["choice"], "candidates": tuple(record.meta["choice"]["candidates"])})
    return thought_text(objects, choice, record.width, chosen)


@torch.no_grad()
def answers_after(model, adapter, records: list[Record], thoughts: list[str]) -> list[str]:
    """Greedy answer text for each record with the thought forced after its prompt (as the model writes it:
    ``<think>thought</think>``, or ``thought\\n</think>`` where the prompt opened the thought)."""
    texts = []
    for record, thought in zip(records, thoughts, strict=True):
        prompt = adapter.build_inputs([record])[0]
        forced = adapter.tokenizer(adapter.thought.thought(thought), add_special_tokens=False).input_ids
        row = prompt.input_ids.tolist() + forced
        batch = collate([prompt], [row], [0], adapter.tokens)
        batch["pixel_values"] = batch["pixel_values"].to(model.dtype)
        out = model.generate(
            **batch,
            max_new_tokens=ANSWER_TOKENS,
            do_sample=False,
            eos_token_id=list(adapter.tokens.eos_ids),
            pad_token_id=adapter.tokens.pad_id,
        )
        texts.append(adapter.tokenizer.decode(out[0, len(row) :], skip_special_tokens=True))
    return texts


def mean_iou(adapter, records: list[Record], thoughts: list[str], answers: list[str]) -> float:
    completions = [
        Completion(adapter.parse_answer(t + a, r), t, a) for r, t, a in zip(records, thoughts, answers)
    ]
    totals = build_reward("iou").score(completions, records).total
    return sum(totals) / len(totals)


def thought_matters(checkpoint: str, records_path: str, config_path: str | None) -> dict[str, float]:
    config = load_config(config_path)
    records = [r for r in read_records(records_path) if "choice" in r.meta]
    if not records:
        raise SystemExit(f"{records_path}: no relational records (make-data --difficulty relational)")
    loaded = load_model(replace(config.model, name_or_path=checkpoint, dtype="float32"))
    model, adapter = loaded.model.eval(), loaded.adapter
    result = {"records": float(len(records))}
    for name, conclude_on in (("reference", lambda r: None), ("wrong", wrong_choice)):
        thoughts = [forced_thought(r, conclude_on(r)) for r in records]
        answers = answers_after(model, adapter, records, thoughts)
        tagged = [adapter.thought.thought(t) for t in thoughts]
        result[f"iou_after_{name}_thought"] = mean_iou(adapter, records, tagged, answers)
    own = generate_predictions(
        model, adapter, records, SamplingParams.from_config(config.rollout, config.seed, greedy=True)
    )
    result["iou_after_own_thought"] = mean_iou(
        adapter, records, [p.thought_text for p in own], [p.answer_text for p in own]
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="Hugging Face model folder")
    parser.add_argument("records", help="relational shapes records.jsonl")
    parser.add_argument("--config", default=None, help="the run config (prompt style, pixel bounds, budgets)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args()
    result = thought_matters(args.checkpoint, args.records, args.config)
    for key, value in result.items():
        print(f"{key:>26}  {value:.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
