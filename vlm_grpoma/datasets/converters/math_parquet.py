"""Math datasets in parquet -> text-only ``answer`` records (``convert --from gsm8k`` / ``--from math``).

- ``gsm8k`` (openai/gsm8k layout): ``question`` is the prompt; ``answer`` holds the worked solution, then
  ``#### 72``: the number after ``####`` (commas removed) is the answer, matched numerically, and the solution
  before it (calculator annotations ``<<48/2=24>>`` removed) is the reference thought (``meta["thought"]``).
- ``math`` (hendrycks MATH layout): ``problem`` is the prompt; the answer is the last ``\\boxed{...}`` /
  ``\\fbox{...}`` of ``solution`` (nested braces kept), matched numerically when it is a plain number, else
  exactly after the matcher's normalisation; the whole solution is the reference thought.

Columns can be renamed with ``--field prompt=COLUMN`` / ``--field solution=COLUMN``; optional ``id`` and
``split`` as for ``--from parquet``. A cell that is not text is an error naming the file, row and column. A
row whose solution has no final answer (no ``####``, nothing boxed) is skipped and counted
(``no_answer``), with a warning naming the first ones: MATH has a few such solutions, and one of them
should not stop a conversion of thousands (a wrong column leaves every row without one, and then nothing is
converted, which is an error). Needs pyarrow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from vlm_grpoma.datasets.converters.common import Converted, ConvertError, ConvertInputs
from vlm_grpoma.datasets.converters.math_solutions import Solution, boxed_solution, gsm8k_solution
from vlm_grpoma.datasets.converters.parquet import parquet_files, parquet_rows, pyarrow_parquet, split_of_file
from vlm_grpoma.datasets.jsonl import record_from_json
from vlm_grpoma.datasets.schema import Record

FIELDS = ("prompt", "solution", "id", "split")
#: How many skipped rows the warning names.
_NAMED_SKIPS = 3

log = logging.getLogger(__name__)


def _text(row: dict, fields: dict[str, str], name: str, where: str) -> str:
    value = row.get(fields[name])
    if not isinstance(value, str) or not value.strip():
        raise ConvertError(f"{where}: column {fields[name]!r} ({name}) must be non-empty text, got {value!r}")
    return value


def _id_prefix(source: Path, file: Path) -> str:
    """The default id prefix of a file's rows: its path below ``source`` without the suffix, ``/`` as ``-``
    (the hub's ``main/`` and ``socratic/`` GSM8K shards have the same file names)."""
    return "-".join(file.relative_to(source).with_suffix("").parts) if source.is_dir() else file.stem


def _convert(
    inputs: ConvertInputs,
    source_format: str,
    defaults: dict[str, str],
    parse: Callable[[str], Solution | None],
) -> Converted:
    """Records from every row of the parquet file(s): prompt and solution columns, ``parse`` reads the answer."""
    pq = pyarrow_parquet(source_format)
    if inputs.task not in (None, "answer"):
        raise ConvertError(f"--task: --from {source_format} makes answer records, got {inputs.task!r}")
    if inputs.box_format != "xyxy":
        raise ConvertError(f"--box-format does not apply to --from {source_format}")
    fields = {**defaults, **inputs.fields}
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ConvertError(
            f"--field {unknown[0]}: unknown for --from {source_format}; fields are {', '.join(FIELDS)}"
        )
    records: list[Record] = []
    counts = {"rows": 0, "numeric": 0, "no_answer": 0}
    skipped: list[str] = []
    for file in parquet_files(inputs.source):
        prefix = _id_prefix(inputs.source, file)
        for row_index, row in parquet_rows(pq, file, fields):
            row_id = str(row[fields["id"]]) if "id" in fields else f"{prefix}-{row_index:06d}"
            where = f"{file}: row {row_index} (id {row_id})"
            prompt = _text(row, fields, "prompt", where).strip()
            try:
                solution = parse(_text(row, fields, "solution", where))
            except ValueError as err:
                raise ConvertError(f"{where}: column {fields['solution']!r} (solution): {err}") from None
            if solution is None:
                counts["no_answer"] += 1
                skipped.append(f"row {row_index} of {file.name}")
                continue
            counts["rows"] += 1
            counts["numeric"] += solution.matcher == "numeric"
            line = {
                "id": row_id,
                "task": "answer",
                "prompt": prompt,
                "ground_truth": {"answer": solution.answer, "matcher": solution.matcher},
                "split": str(row[fields["split"]]) if "split" in fields else split_of_file(file),
                "meta": {
                    "source": source_format,
                    "file": file.name,
                    "row": row_index,
                    "thought": solution.thought,
                },
            }
            try:
                records.append(record_from_json(line, inputs.output_dir))
            except ValueError as err:
                raise ConvertError(f"{where}: {err}") from None
    if skipped:
        log.warning(
            "skipped %d rows whose %s column has no final answer (%s): %s%s",
            len(skipped),
            fields["solution"],
            "no ####" if source_format == "gsm8k" else "nothing boxed",
            ", ".join(skipped[:_NAMED_SKIPS]),
            ", ..." if len(skipped) > _NAMED_SKIPS else "",
        )
    return Converted(records, counts)


def convert_gsm8k(inputs: ConvertInputs) -> Converted:
    """GSM8K-style rows (``question``, ``answer`` with ``#### N``) -> numeric answer records."""
    return _convert(inputs, "gsm8k", {"prompt": "question", "solution": "answer"}, gsm8k_solution)


def convert_math(inputs: ConvertInputs) -> Converted:
    """MATH-style rows (``problem``, ``solution`` with ``\\boxed{}``) -> answer records."""
    return _convert(inputs, "math", {"prompt": "problem", "solution": "solution"}, boxed_solution)
