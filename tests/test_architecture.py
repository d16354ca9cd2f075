"""The import rules of docs/architecture.md: lower layers never import higher ones, library code never imports
the CLI, no import circle. Checked on the source (every import statement, function-level ones included), so a
violation fails here before it can become an import cycle or a library that drags the command line along; the
lazy ``"module:attr"`` tables follow the same rules. And the document's map stays true: every CLI command and
every module of the package is in it."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vlm_grpoma"

#: Top-level parts of the package, lowest layer first; a part may import its own layer and the layers below.
LAYERS: list[set[str]] = [
    {
        "errors",
        "cache",
        "config",
        "sampling",
        "distributed",
        "answers",
        "algorithm",
        "output_folder",
        "run_layout",
        "lockfile",
    },
    {"envs", "datasets", "models"},
    {"rewards", "rollout"},
    {"trainer", "eval"},
    {"demo", "env_report", "cli", "launch_scripts", "planning"},
]
#: Imports allowed between parts of the same layer (anything else within a layer is forbidden).
SAME_LAYER_ALLOWED = {
    ("config", "errors"),
    ("config", "sampling"),  # validation builds the sampling parameters instead of repeating their checks
    ("distributed", "cache"),
    ("output_folder", "errors"),
    ("datasets", "envs"),  # make-data renders SAPIEN objects
    ("models", "datasets"),  # adapters read records and images
    ("demo", "env_report"),
    ("cli", "planning"),  # plan's --help states its assumptions
    ("cli", "demo"),  # the command table names every handler (lazily, as "module:function")
    ("cli", "env_report"),
    ("cli", "launch_scripts"),
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
MODULES = {module_name(path) for path in SOURCES}


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(module_name(path)) for path in SOURCES} - {"__init__"}
    assert parts <= set(LAYER_OF), f"give these a layer in LAYERS: {sorted(parts - set(LAYER_OF))}"


def layer_problem(importer: str, imported: str) -> str | None:
    """Why module ``importer`` may not import module ``imported`` under the rules above, or None if it may."""
    source, target = part_of(importer), part_of(imported)
    if source == "__init__":
        return None
    if imported == "vlm_grpoma.cli" and importer != "vlm_grpoma.cli":
        return f"{imported} (library code raises vlm_grpoma.errors; only the CLI maps them)"
    if target in ("__init__", source):
        return None
    if LAYER_OF[target] > LAYER_OF[source]:
        return f"{imported} (layer {LAYER_OF[target]} above {source}'s {LAYER_OF[source]})"
    if LAYER_OF[target] == LAYER_OF[source] and (source, target) not in SAME_LAYER_ALLOWED:
        return f"{imported} (same layer as {source}; not in SAME_LAYER_ALLOWED)"
    return None


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_only_go_down(path):
    importer = module_name(path)
    wrong = [problem for imported in imported_modules(path) if (problem := layer_problem(importer, imported))]
    assert not wrong, f"{importer} imports " + "; ".join(sorted(wrong))


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: a rollout module importing the trainer is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from vlm_grpoma.trainer.engine import build_engine\n")
    assert imported_modules(bad) == {"vlm_grpoma.trainer.engine"}
    assert LAYER_OF[part_of("vlm_grpoma.trainer.engine")] > LAYER_OF["rollout"]


# -- lazy "module:attr" tables ------------------------------------------------------------------------------


def lazy_tables() -> dict[str, tuple[str, list[str]]]:
    """Table name -> (the module that owns the table and imports its entries, the ``"module:attr"`` entries)."""
    from vlm_grpoma.cli import COMMANDS
    from vlm_grpoma.datasets.converters.registry import FORMATS
    from vlm_grpoma.rewards.registry import BUILTIN_REWARDS

    return {
        "cli.COMMANDS": ("vlm_grpoma.cli", [command.handler for command in COMMANDS]),
        "rewards.registry.BUILTIN_REWARDS": ("vlm_grpoma.rewards.registry", list(BUILTIN_REWARDS.values())),
        "converters.registry.FORMATS": (
            "vlm_grpoma.datasets.converters.registry",
            [fmt.converter for fmt in FORMATS.values()],
        ),
    }


@pytest.mark.parametrize("table", sorted(lazy_tables()))
def test_lazy_tables_resolve_within_the_layer_rules(table):
    """Each entry imports (as the table's owner will at run time), names a callable there, and is a module its
    owner may import: a string entry escapes the import statements checked above."""
    owner, entries = lazy_tables()[table]
    wrong = []
    for entry in entries:
        module, _, attribute = entry.partition(":")
        if problem := layer_problem(owner, module):
            wrong.append(f"{entry}: {owner} may not import {problem}")
        elif not callable(getattr(importlib.import_module(module), attribute, None)):
            wrong.append(f"{entry}: {module} has no callable {attribute!r}")
    assert not wrong, f"{table}: " + "; ".join(wrong)


def test_the_table_rule_catches_an_entry_above_its_owner():
    assert "layer 3 above rewards's 2" in layer_problem(
        "vlm_grpoma.rewards.registry", "vlm_grpoma.trainer.base"
    )
    assert layer_problem("vlm_grpoma.cli", "vlm_grpoma.demo") is None


# -- import circles -------------------------------------------------------------------------------------------


def module_level_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports when it is loaded: statements outside functions and outside
    ``if TYPE_CHECKING:``; ``from package import module`` counts as importing that module."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    found.add(submodule if submodule in MODULES else node.module)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found & MODULES


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's strongly connected
    components of more than one module, or a module importing itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1 or node in graph.get(node, ()):
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(circles)


def test_the_package_has_no_import_circle():
    graph = {module_name(path): module_level_imports(path) for path in SOURCES}
    circles = import_circles(graph)
    assert not circles, "modules importing each other at module level: " + "; ".join(
        " <-> ".join(group) for group in circles
    )


def test_the_circle_check_finds_a_circle_through_three_modules(tmp_path):
    """The checker itself: a -> b -> c -> a is one circle, d (importing a) and a TYPE_CHECKING import are not."""
    source = tmp_path / "c.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nimport vlm_grpoma.config\nif TYPE_CHECKING:\n    import vlm_grpoma.cli\n"
        "def f():\n    import vlm_grpoma.trainer.base\n"
    )
    assert module_level_imports(source) == {"vlm_grpoma.config"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_circles(graph) == [["a", "b", "c"], ["e"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


# -- docs/architecture.md ------------------------------------------------------------------------------------

ARCHITECTURE = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")


def module_map_entries(document: str = ARCHITECTURE) -> dict[str, str]:
    """The package entries of the module map: path (``rollout/vllm/``, ``config.py``) -> its text.

    An entry is a line indented 2 (or 4, 6 under the folder above it) naming a folder or module, continued
    by the more deeply indented lines after it; the map's ``vlm_grpoma/`` block ends at the next unindented line.
    """
    block = document.split("## Module map", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    folders: list[tuple[int, str]] = []
    in_package, last = False, None
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent == 0:
            in_package, folders = line.startswith("vlm_grpoma/"), []
            continue
        if not in_package:
            continue
        if indent <= 6:
            while folders and folders[-1][0] >= indent:
                folders.pop()
            key = line.split()[0].rstrip(",")
            last = (folders[-1][1] if folders else "") + key
            if key.endswith("/"):
                folders.append((indent, last))
            entries[last] = line.strip()
        else:
            entries[last] += " " + line.strip()
    return entries


def documented_modules(entries: dict[str, str]) -> set[str]:
    """Every ``name.py`` an entry names, as a path below the package (an entry's modules are in its folder)."""
    found = set()
    for path, text in entries.items():
        folder = path if path.endswith("/") else path[: path.rfind("/") + 1]
        found.update(folder + name for name in re.findall(r"\b\w+\.py\b", text))
    return found


def test_every_module_of_the_package_is_in_the_module_map():
    entries = module_map_entries()
    modules = {str(p.relative_to(PACKAGE)) for p in SOURCES if p.name != "__init__.py"}
    packages = {
        f"{p.parent.relative_to(PACKAGE)}/"
        for p in SOURCES
        if p.name == "__init__.py" and p.parent != PACKAGE
    }
    documented = documented_modules(entries)
    missing = sorted(modules - documented) + sorted(
        package for package in packages if not any(path.startswith(package) for path in entries)
    )
    stale = sorted(documented - modules)
    assert not missing and not stale, (
        f"docs/architecture.md's module map lacks: {', '.join(missing) or 'nothing'}; "
        f"names modules that do not exist: {', '.join(stale) or 'none'}"
    )


def test_every_cli_command_is_in_the_architecture_doc():
    from vlm_grpoma.cli import COMMANDS

    section = ARCHITECTURE.split("### CLI", 1)[1].split("\n#", 1)[0]
    listed = {name.strip() for name in re.search(r"`vlm-grpoma ([^`]+)`", section).group(1).split("|")}
    commands = {command.name for command in COMMANDS}
    assert listed == commands, (
        f"docs/architecture.md's CLI list lacks: {', '.join(sorted(commands - listed)) or 'nothing'}; "
        f"lists commands that do not exist: {', '.join(sorted(listed - commands)) or 'none'}"
    )


def test_the_module_map_reader_places_modules_in_their_folders():
    """The reader itself, on a map shaped like the real one: nested folders, continued lines, other roots."""
    document = (
        "## Module map\n\n```\nvlm_grpoma/\n"
        "  errors.py            UserError\n"
        "  rollout/             tree.py (RolloutTree),\n"
        "                       hf.py\n"
        "    vllm/              stack.py, engine.py\n"
        "  env_report.py, launch_scripts.py (writes launch/)\n"
        "benchmarks/            compare.py\n```\n"
    )
    entries = module_map_entries(document)
    assert set(entries) == {"errors.py", "rollout/", "rollout/vllm/", "env_report.py"}
    assert documented_modules(entries) == {
        "errors.py",
        "rollout/tree.py",
        "rollout/hf.py",
        "rollout/vllm/stack.py",
        "rollout/vllm/engine.py",
        "env_report.py",
        "launch_scripts.py",
    }
