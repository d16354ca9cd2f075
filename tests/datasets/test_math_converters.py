"""Math datasets: final answers read from GSM8K ``####`` and MATH ``\\boxed{}`` solutions on hand-made cases,
and ``convert --from gsm8k`` / ``--from math`` on synthetic parquet files in those layouts (bad rows, skips)."""

from __future__ import annotations

import json
import logging

import pytest

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.converters import convert
from vlm_grpoma.datasets.converters.common import ConvertError
from vlm_grpoma.datasets.converters.math_solutions import (
    boxed_solution,
    gsm8k_solution,
    last_boxed,
    plain_number,
)

GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 1,072"
)


def test_gsm8k_answer_is_the_number_after_hashes_without_commas_and_the_thought_loses_annotations():
    solution = gsm8k_solution(GSM8K_ANSWER)
    assert solution.answer == "1072" and solution.matcher == "numeric"
    assert solution.thought == (
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May."
    )
    assert gsm8k_solution("x\n#### -3.5").answer == "-3.5"
    assert gsm8k_solution("x #### $ 12 ").answer == "12"


def test_gsm8k_without_a_final_answer_is_none_and_a_word_answer_is_an_error():
    assert gsm8k_solution("no final line") is None
    assert gsm8k_solution("reasoning ####   ") is None
    with pytest.raises(ValueError, match="not a number: '5 apples'"):
        gsm8k_solution("x #### 5 apples")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $x = \boxed{5}$.", "5"),
        (r"first \boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # the last box, nested braces kept
        (r"\boxed{\sqrt{\frac{a}{b}} + {c}}", r"\sqrt{\frac{a}{b}} + {c}"),
        (r"the answer is $\fbox{(C)}$", "(C)"),
        (r"hence \boxed 7.", "7"),
        (r"\boxed{ 3,000 }", "3,000"),
    ],
)
def test_last_boxed_reads_nested_braces_fbox_and_the_space_form(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text", [r"no box here", r"\boxed{unclosed {x}", r"\boxed{}", r"\boxedsomething{3}", r"\boxed"]
)
def test_last_boxed_is_none_without_a_complete_box(text):
    assert last_boxed(text) is None


def test_boxed_matcher_is_numeric_for_plain_numbers_else_exact():
    numeric = boxed_solution(r"Add them: $2+3=\boxed{5}$")
    assert (numeric.answer, numeric.matcher) == ("5", "numeric")
    assert numeric.thought == r"Add them: $2+3=\boxed{5}$"
    assert boxed_solution(r"\boxed{1,250}").answer == "1250"
    assert boxed_solution(r"\boxed{0}").matcher == "numeric"
    fraction = boxed_solution(r"\boxed{\frac{3}{4}}")
    assert (fraction.answer, fraction.matcher) == (r"\frac{3}{4}", "exact")
    assert boxed_solution("nothing boxed") is None


def test_plain_number():
    assert plain_number(" 1,234 ") == "1234"
    assert plain_number("-0.5") == "-0.5"
    assert plain_number("1/2") is None and plain_number("x") is None and plain_number("") is None


@pytest.fixture
def pq():
    return pytest.importorskip("pyarrow.parquet", reason="pyarrow is the optional [parquet] extra")


def write_parquet(pq, path, columns: dict) -> None:
    import pyarrow as pa

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def written(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_hub_layout_becomes_numeric_answer_records_with_the_solution_as_thought(tmp_path, pq):
    write_parquet(
        pq,
        tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet",
        {
            "question": ["How many clips?", "How far?"],
            "answer": [GSM8K_ANSWER, "10 + 5 = <<10+5=15>>15\n#### 15"],
        },
    )
    path, records, counts = convert("gsm8k", tmp_path / "gsm8k", tmp_path / "out")
    assert counts == {"rows": 2, "numeric": 2, "no_answer": 0}
    first, second = written(path)
    assert set(first) <= {"id", "task", "prompt", "ground_truth", "split", "meta"}  # text only: no image keys
    assert first["task"] == "answer" and first["prompt"] == "How many clips?" and first["split"] == "test"
    assert first["ground_truth"]["answer"] == "1072"
    assert first["ground_truth"].get("matcher") == "numeric"
    assert first["meta"]["thought"].startswith("Natalia sold 48/2 = 24 clips")
    assert (first["meta"]["file"], first["meta"]["row"]) == ("test-00000-of-00001.parquet", 0)
    assert second["ground_truth"]["answer"] == "15" and second["meta"]["thought"] == "10 + 5 = 15"
    assert (first["id"], second["id"]) == (
        "main-test-00000-of-00001-000000",
        "main-test-00000-of-00001-000001",
    )


def test_math_layout_with_renamed_columns_splits_and_skipped_rows(tmp_path, pq, caplog):
    write_parquet(
        pq,
        tmp_path / "math.parquet",
        {
            "idx": ["a", "b", "c"],
            "question": ["Add 2 and 3.", "Half of one?", "Prove it."],
            "worked": [r"$2+3=\boxed{5}$", r"It is $\boxed{\frac{1}{2}}$.", "A proof with no final answer."],
            "part": ["train", "test", "train"],
        },
    )
    fields = {"prompt": "question", "solution": "worked", "id": "idx", "split": "part"}
    with caplog.at_level(logging.WARNING):
        path, _, counts = convert("math", tmp_path / "math.parquet", tmp_path / "o.jsonl", fields=fields)
    assert counts == {"rows": 2, "numeric": 1, "no_answer": 1}
    assert (
        "skipped 1 rows whose worked column has no final answer (nothing boxed): row 2 of math.parquet"
        in (caplog.text)
    )
    five, half = written(path)
    assert (five["id"], five["split"], five["ground_truth"]["answer"]) == ("a", "train", "5")
    assert five["ground_truth"].get("matcher") == "numeric"
    assert (half["id"], half["split"], half["ground_truth"]["answer"]) == ("b", "test", r"\frac{1}{2}")
    assert half["ground_truth"].get("matcher", "exact") == "exact"
    assert half["meta"]["thought"] == r"It is $\boxed{\frac{1}{2}}$."


def test_an_empty_prompt_after_a_good_row_names_its_row(tmp_path, pq):
    write_parquet(pq, tmp_path / "g.parquet", {"question": ["ok", None], "answer": ["#### 1", "#### 2"]})
    with pytest.raises(
        ConvertError, match=r"g\.parquet: row 1 \(id g-000001\): column 'question' \(prompt\) "
    ):
        convert("gsm8k", tmp_path / "g.parquet", tmp_path / "o")


def test_bad_cells_and_options_name_the_file_row_and_column(tmp_path, pq):
    write_parquet(pq, tmp_path / "w.parquet", {"question": ["q"], "answer": ["#### five"]})
    with pytest.raises(
        ConvertError, match=r"w\.parquet: row 0 \(id w-000000\): column 'answer' \(solution\): .*'five'"
    ):
        convert("gsm8k", tmp_path / "w.parquet", tmp_path / "o")
    with pytest.raises(ConvertError, match="no column for --field prompt=problem; columns: question, answer"):
        convert("math", tmp_path / "w.parquet", tmp_path / "o")
    with pytest.raises(ConvertError, match="--task: --from gsm8k makes answer records, got 'detection'"):
        convert("gsm8k", tmp_path / "w.parquet", tmp_path / "o", task="detection")
    with pytest.raises(ConvertError, match="--field image: unknown for --from math"):
        convert("math", tmp_path / "w.parquet", tmp_path / "o", fields={"image": "x"})


def test_a_file_without_any_final_answer_converts_nothing(tmp_path, pq):
    write_parquet(pq, tmp_path / "g.parquet", {"question": ["q"], "answer": ["no hashes"]})
    with pytest.raises(ConvertError, match="nothing to convert"):
        convert("gsm8k", tmp_path / "g.parquet", tmp_path / "o")


def test_convert_cli_prints_the_counts(tmp_path, pq, capsys):
    write_parquet(pq, tmp_path / "g.parquet", {"question": ["q"], "answer": ["#### 3"]})
    assert cli_main(["convert", "--from", "gsm8k", str(tmp_path / "g.parquet"), str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 answer records from gsm8k" in out and "rows=1, numeric=1, no_answer=0" in out
