"""The config reference: every leaf key with its type, default, range and doc line (``train --help``, docs)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from vlm_grpoma.config.loading import _type_name
from vlm_grpoma.config.rules import _RULE
from vlm_grpoma.config.sections import Config


@dataclass(frozen=True)
class FieldDoc:
    """One leaf config key as documented: ``range`` is its rule's text ("" where none applies on its own)."""

    key: str
    type: str
    default: Any
    range: str
    doc: str


@functools.cache
def _doc_lines(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines directly above each field of a dataclass, read from its source."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    (node,) = ast.parse(source).body
    docs = {}
    for statement in typing.cast(ast.ClassDef, node).body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            above, row = [], statement.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip().removeprefix("#:").strip().replace("``", "`"))
                row -= 1
            docs[statement.target.id] = " ".join(above)
    return docs


def config_reference() -> list[FieldDoc]:
    """Every leaf key of :class:`Config` in declaration order (``train --help``, the reference page)."""
    out: list[FieldDoc] = []

    def walk(cls: type, instance: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, value = f"{prefix}{f.name}", getattr(instance, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], value, f"{key}.")
                continue
            rule = f.metadata.get(_RULE)
            doc = _doc_lines(cls).get(f.name, "")
            out.append(FieldDoc(key, _type_name(hints[f.name]), value, rule.describe() if rule else "", doc))

    walk(Config, Config(), "")
    return out
