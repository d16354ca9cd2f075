"""The import rules of docs/architecture.md: lower layers never import higher ones, library code never imports
the CLI. Checked on the source (every import statement, function-level ones included), so a violation fails
here before it can become an import cycle or a library that drags the command line along."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vlm_grpoma"

#: Top-level parts of the package, lowest layer first; a part may import its own layer and the layers below.
LAYERS: list[set[str]] = [
    {"errors", "cache", "config", "distributed", "answers", "algorithm", "output_folder"},
    {"envs", "datasets", "models"},
    {"rewards", "rollout"},
    {"trainer", "eval"},
    {"demo", "env_report", "cli", "launch_scripts", "planning"},
]
#: Imports allowed between parts of the same layer (anything else within a layer is forbidden).
SAME_LAYER_ALLOWED = {
    ("config", "errors"),
    ("distributed", "cache"),
    ("output_folder", "errors"),
    ("datasets", "envs"),  # make-data renders SAPIEN objects
    ("models", "datasets"),  # adapters read records and images
    ("demo", "env_report"),
    ("cli", "planning"),  # plan's --help states its assumptions
}
LAYER_OF = {part: index for index, layer in enumerate(LAYERS) for part in layer}


def part_of(module: str) -> str:
    """``vlm_grpoma.trainer.engine`` -> ``trainer``; ``vlm_grpoma`` (the package itself) -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``vlm_grpoma`` module ``path`` imports, at any nesting level."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(name for name in names if name == "vlm_grpoma" or name.startswith("vlm_grpoma."))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(module_name(path)) for path in SOURCES} - {"__init__"}
    assert parts <= set(LAYER_OF), f"give these a layer in LAYERS: {sorted(parts - set(LAYER_OF))}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_only_go_down(path):
    importer = module_name(path)
    source = part_of(importer)
    if source == "__init__":
        return
    wrong = []
    for imported in imported_modules(path):
        target = part_of(imported)
        if imported == "vlm_grpoma.cli" and importer != "vlm_grpoma.cli":
            wrong.append(f"{imported} (library code raises vlm_grpoma.errors; only the CLI maps them)")
        elif target in ("__init__", source):
            continue
        elif LAYER_OF[target] > LAYER_OF[source]:
            wrong.append(f"{imported} (layer {LAYER_OF[target]} above {source}'s {LAYER_OF[source]})")
        elif LAYER_OF[target] == LAYER_OF[source] and (source, target) not in SAME_LAYER_ALLOWED:
            wrong.append(f"{imported} (same layer as {source}; not in SAME_LAYER_ALLOWED)")
    assert not wrong, f"{importer} imports " + "; ".join(sorted(wrong))


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: a rollout module importing the trainer is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from vlm_grpoma.trainer.engine import build_engine\n")
    assert imported_modules(bad) == {"vlm_grpoma.trainer.engine"}
    assert LAYER_OF[part_of("vlm_grpoma.trainer.engine")] > LAYER_OF["rollout"]
