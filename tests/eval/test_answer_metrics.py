"""``eval``'s short-answer metrics on hand-made predictions: accuracy (the ``answer_match`` reward's 1), the default
matcher for records that name none, pass@k from the samples, and the files (no overlays: nothing to draw)."""

from __future__ import annotations

import json
import math

import pytest

from vlm_grpoma.answers import Box, Boxes, parse_answer
from vlm_grpoma.datasets.schema import ANSWER_KIND_OF_TASK, Record, ShortAnswer
from vlm_grpoma.eval.grounding_metrics import Prediction, score_predictions
from vlm_grpoma.eval.grounding_report import summary, summary_markdown, write_report
from vlm_grpoma.eval.sampled_metrics import add_sampled_metrics

THOUGHT = "<think>working</think>"


def answer_record(answer: str, matcher: str | None = None, rid: str = "a0") -> Record:
    return Record(rid, None, "answer", "p", None, None, ShortAnswer(answer, matcher))


def predict(record: Record, answer_text: str, sample: int = 0) -> Prediction:
    answer = parse_answer(THOUGHT + answer_text, ANSWER_KIND_OF_TASK[record.task])
    return Prediction(record, sample, THOUGHT, answer_text, answer)


def test_accuracy_counts_the_answers_answer_match_scores_one():
    cases = [  # (truth, matcher, model's answer text, correct)
        ("1072", "numeric", "<answer>1,072</answer>", True),
        ("0.75", "numeric", "<answer>\\boxed{3/4}</answer>", True),
        ("-2", "numeric", "<answer>The answer is -2.</answer>", True),
        ("Paris", "exact", "<answer> paris. </answer>", True),
        ("B", "choice", "<answer>(b)</answer>", True),
        ("8", "numeric", "<answer>7</answer>", False),
        ("8", "numeric", "8", False),  # no answer tag: a failure, scored wrong
    ]
    preds = [predict(answer_record(t, m, f"a{i}"), text) for i, (t, m, text, _) in enumerate(cases)]
    report = score_predictions(preds)
    task = report.tasks["answer"]
    assert [p.scores["correct"] for p in report.predictions] == [float(c) for *_, c in cases]
    assert task.metrics == {"accuracy": pytest.approx(5 / 7)}
    assert task.records == task.predictions == 7 and task.failures == {"no_answer_tag": 1}
    assert task.parse_rate == pytest.approx(6 / 7) and task.format_rate == pytest.approx(6 / 7)


def test_records_without_a_matcher_use_the_runs_default():
    preds = [predict(answer_record("5"), "<answer>5.0</answer>")]
    assert score_predictions(preds).tasks["answer"].metrics["accuracy"] == 0.0  # exact: "5.0" is not "5"
    assert score_predictions(preds, answer_matcher="numeric").tasks["answer"].metrics["accuracy"] == 1.0


def test_answers_and_boxes_in_one_report_keep_their_own_metrics():
    box = Record("d0", "unused.png", "detection", "p", 100, 100, Boxes((Box(0, 0, 10, 10),)))
    preds = [
        Prediction(
            box, 0, THOUGHT, "<answer>[[0, 0, 10, 10]]</answer>", parse_answer("[[0, 0, 10, 10]]", "boxes")
        ),
        predict(answer_record("3"), "<answer>3</answer>"),
    ]
    report = score_predictions(preds)
    assert report.tasks.keys() == {"detection", "answer"}
    assert report.tasks["detection"].metrics["mean_iou"] == pytest.approx(1.0)
    assert report.tasks["answer"].metrics["accuracy"] == 1.0


def test_an_answer_record_without_a_short_answer_is_an_error_naming_it():
    wrong = Record("ans-9", None, "answer", "p", None, None, Boxes(()))
    with pytest.raises(ValueError, match="ans-9.*short-answer ground truth"):
        score_predictions([predict(wrong, "<answer>3</answer>")])


def test_pass_at_k_of_sampled_answers(tmp_path):
    """Record one: 1 of 3 samples right, record two: 3 of 3; pass@k = mean of 1 - C(n-c, k) / C(n, k)."""
    outcomes = {"a0": ["7", "9", "8"], "a1": ["4", "4", "4"]}
    truths = {"a0": "8", "a1": "4"}
    preds = [
        predict(answer_record(truths[rid], "numeric", rid), f"<answer>{text}</answer>", s)
        for rid, texts in outcomes.items()
        for s, text in enumerate(texts)
    ]
    report = score_predictions(preds, samples=3, greedy=False)
    add_sampled_metrics(report)
    metrics = report.tasks["answer"].metrics
    for k in (1, 2, 3):
        expected = ((1 - math.comb(2, k) / math.comb(3, k)) + 1.0) / 2
        assert metrics[f"pass@{k}"] == pytest.approx(expected)
    assert metrics["accuracy"] == pytest.approx(metrics["pass@1"]) == pytest.approx(4 / 6)
    assert metrics["best_of_3/correct"] == 1.0

    files = write_report(report, tmp_path / "val", overlays=16)
    assert files["overlays"] == []  # short answers have no coordinates to draw
    written = json.loads(files["metrics"].read_text())
    assert written["tasks"]["answer"]["metrics"]["pass@2"] == pytest.approx(metrics["pass@2"])
    table = summary_markdown(summary({"val": report}, {}))
    assert "| split | records | format_rate | accuracy | pass@1 | pass@2 | pass@3 |" in table
