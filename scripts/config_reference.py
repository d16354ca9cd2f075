"""Writes docs/reference/config.md, the config reference, from the dataclasses (``config_reference()``, the same
list ``train --help`` prints); ``--check`` exits 1 when the committed page differs from a fresh one (CI)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from itertools import groupby
from pathlib import Path

from vlm_grpoma.config import FieldDoc, config_reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"
HEADER = """# Config reference

Every key of a run config, generated from the dataclasses in `vlm_grpoma/config/sections.py` (type and default
from the field, range from its rule, description from its `#:` line) by `make config-reference`
(`scripts/config_reference.py`); a test checks this page against a fresh generation. Set any key in the YAML
file or as a dotted override, `key=value`, before or after the flags (`vlm-grpoma train --help` prints the same
list). How the keys fit together: [the training guide](../training.md#configuration).
"""


def _text(value: str) -> str:
    """Markdown-safe table-cell text: code spans kept as they are, Markdown's special characters escaped elsewhere."""
    parts = re.split(r"(`[^`]*`)", value)
    return "".join(part if part.startswith("`") else _escape(part) for part in parts)


def _escape(text: str) -> str:
    """``<`` as an entity (a backslash does not stop an HTML tag), the other special characters backslashed."""
    return re.sub(r"([\\`*_|\[\]])", r"\\\1", text).replace("<", "&lt;")


def _code(value: str) -> str:
    """One code span holding ``value`` (a longer fence where it contains backticks)."""
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def _row(doc: FieldDoc) -> str:
    default = _code(json.dumps(doc.default, ensure_ascii=False))
    return f"| {_code(doc.key)} | {_code(doc.type)} | {default} | {_text(doc.range)} | {_text(doc.doc)} |"


def _section(doc: FieldDoc) -> str:
    """The key's section: everything before its last dot ("" for a top-level key such as ``seed``)."""
    return doc.key.rpartition(".")[0]


def render(docs: list[FieldDoc]) -> str:
    """The reference page: one table per section, in declaration order."""
    out = [HEADER]
    for section, group in groupby(docs, key=_section):
        out.append(f"\n## {_code(section) if section else 'Top level'}\n")
        out.append("| key | type | default | range | description |")
        out.append("|---|---|---|---|---|")
        out.extend(_row(doc) for doc in group)
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed page instead of writing"
    )
    args = parser.parse_args()
    fresh = render(config_reference())
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != fresh:
            print(f"{PAGE}: out of date; run `make config-reference`", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
