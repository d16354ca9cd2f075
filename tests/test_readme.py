"""Every command in the README and the manual (``docs/**/*.md``) works when pasted into a shell: each ``bash``
block passes ``bash -n``, every line splits as the shell splits it, ``vlm-grpoma`` lines parse with the CLI's own
parser and their overrides build a valid config, scripts and configs they name exist; the example records are
valid records, the example reward runs, and the cheap commands (building a tiny model, the RefCOCO pickle step)
are run. Shown command output marked ``<!-- output of: vlm-grpoma ... -->`` is that command's real output; the
README is a front page that links every page; the config reference is current; the site builds strictly."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_grpoma.cli import build_parser
from vlm_grpoma.config import load_config
from vlm_grpoma.datasets.jsonl import record_from_json

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
#: every page whose commands are checked, by its path in the repository: the README and the manual
PAGES = {
    path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
}
BLOCKS = [
    (lang, body)
    for text in PAGES.values()
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
]
PLACEHOLDERS = {"…", "CONFIG", "DIR"}


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == language]


def commands(block: str) -> list[list[str]]:
    """The block's commands as the shell splits them (continuations joined, comments dropped, ``$V`` set)."""
    variables, out = {}, []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            name, value = words[0].split("=", 1)
            variables[name] = value
            continue
        out.append([re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), w) for w in words])
    return out


def without_env(words: list[str]) -> list[str]:
    """The command after any ``NAME=value`` environment assignments."""
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    return words


ALL_COMMANDS = [c for block in blocks("bash") for c in commands(block)]


def test_the_pages_have_commands_records_and_a_reward():
    assert len(ALL_COMMANDS) > 30 and blocks("json") and blocks("python")


def test_the_readme_is_a_front_page_opening_with_the_commands():
    assert len(README.splitlines()) <= 250
    first = re.search(r"^```bash\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL).group(1)
    assert [c[:2] for c in commands(first)][:2] == [["make", "demo"], ["make", "test"]]


def test_the_site_home_shows_the_readme_guide_table():
    """docs/index.md repeats README's table of guides (links relative to docs/), so the two cannot drift apart."""

    def table(text: str) -> str:
        return re.search(r"^\| guide \|.*?\n(?=\n)", text, flags=re.MULTILINE | re.DOTALL).group(0)

    assert table(PAGES["docs/index.md"]) == table(README).replace("](docs/", "](")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_code_fences_are_closed(page):
    """An unclosed fence would swallow the rest of the page (and pair later fences wrongly for these checks)."""
    fences = [line for line in PAGES[page].splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0 and all(f == "```" for f in fences[1::2]), page


def test_every_page_of_the_manual_is_one_click_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", README))
    pages = {page for page in PAGES if page.startswith("docs/") and page != "docs/index.md"}
    assert pages - linked == set(), "not linked from README.md"
    assert {link for link in linked if not (REPO / link).is_file()} == set(), "README links a missing page"


@pytest.mark.parametrize("block", blocks("bash"), ids=lambda b: b.splitlines()[0][:40])
def test_bash_blocks_are_valid_shell(block):
    result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def check_overrides(config: str | None, overrides: list[str]) -> None:
    """The overrides build a valid config, on top of ``config`` when it is a file of this repository."""
    overrides = [o for o in overrides if o not in PLACEHOLDERS]
    path = REPO / config if config and (REPO / config).is_file() else None
    load_config(path, overrides)


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0].endswith("vlm-grpoma")],
    ids=lambda c: " ".join(c)[:70],
)
def test_vlm_grpoma_commands_parse_and_their_overrides_validate(words):
    argv = without_env(words)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"argparse refused {' '.join(words)} (exit {exit_.code})")
    config = getattr(args, "config", None)
    if config and config not in PLACEHOLDERS:
        assert (REPO / config).is_file() or config.endswith("run.yaml"), f"{config} is not in the repository"
    check_overrides(config, list(getattr(args, "overrides", [])))


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0] == "launch/train.sh"],
    ids=lambda c: " ".join(c)[:70],
)
def test_launcher_commands_name_a_config_and_valid_overrides(words):
    config, *overrides = without_env(words)[1:]
    assert config in PLACEHOLDERS or (REPO / config).is_file(), config
    check_overrides(config, overrides)


@pytest.mark.parametrize(
    "words",
    [c for c in ALL_COMMANDS if without_env(c)[0].endswith("python") and c[1] not in ("-c", "-")],
    ids=lambda c: " ".join(c)[:70],
)
def test_python_scripts_exist(words):
    assert (REPO / without_env(words)[1]).is_file(), words


def test_inline_overrides_with_spaces_are_quoted():
    for span in re.findall(r"`([^`\n]+)`", "\n".join(PAGES.values())):
        for match in re.finditer(r"(\S+)=\{[^}]*\s", span):  # key={a: 1, ...} unquoted splits in a shell
            assert match.group(1).startswith("'"), f"quote the override in `{span}`"


@pytest.mark.parametrize("block", blocks("json"), ids=lambda b: b[:30])
def test_example_records_are_valid(block):
    lines = [json.loads(line) for line in block.splitlines() if line.strip()]
    visual = {"detection", "affordance", "trajectory", "manipulation"}
    several = all("images" in r or "video" in r for r in lines)  # the several-images examples: any tasks
    assert several or {r["task"] for r in lines} in (
        visual,
        {"answer"},
    )  # one record of each visual task, or an answer one
    for obj in lines:
        record_from_json(obj, Path("."))


def test_the_several_images_conversion_example_runs(tmp_path, monkeypatch):
    """docs/data.md's synthetic parquet and LLaVA multi-image inputs convert to records with several images."""
    pytest.importorskip("pyarrow", reason="pyarrow is the optional [parquet] extra")
    from vlm_grpoma.cli import main as cli_main
    from vlm_grpoma.datasets.jsonl import read_records

    (block,) = [b for b in blocks("bash") if "python - <<'PY'" in b]
    script, _, rest = block.partition("python - <<'PY'\n")[2].partition("PY\n")
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "docs/data.md", "exec"), {})
    for words in commands(rest):
        assert cli_main(without_env(words)[1:]) == 0, words
    views, history = (
        read_records(tmp_path / "data" / name / "records.jsonl") for name in ("views", "history")
    )
    assert [len(r.images) for r in views + history] == [2, 2] and history[0].target_image == 1


def test_example_reward_function_runs(tmp_path):
    from vlm_grpoma.answers import Box, Boxes, ParseError
    from vlm_grpoma.rewards import Completion, build_rewards

    (source,) = [b for b in blocks("python") if "def one_box" in b]
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "one_box.py").write_text(source)
    spec = f"{tmp_path}/rewards/one_box.py:one_box"
    rewards = build_rewards({spec: 1.0}, {spec: {"bonus": 2.0}})
    from vlm_grpoma.datasets.schema import Record

    record = Record("r", "x.png", "detection", "p", 10, 10, Boxes((Box(0, 0, 5, 5),)))
    batch = [Completion(Boxes((Box(0, 0, 5, 5),))), Completion(ParseError("no_answer_tag"))]
    assert rewards.score(batch, [record, record]).total == [2.0, 0.0]


def test_refcoco_pickle_step_runs_as_pasted(tmp_path):
    (line,) = [line for b in blocks("bash") for line in b.splitlines() if line.startswith("python -c ")]
    refs = [{"ref_id": 1, "ann_id": 2, "image_id": 3, "split": "testA", "sentences": [{"sent": "left man"}]}]
    (tmp_path / "data" / "raw" / "refcoco").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "refcoco" / "refs(unc).p").write_bytes(pickle.dumps(refs))
    result = subprocess.run(
        ["bash", "-c", line.replace("python", sys.executable, 1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "data" / "raw" / "refcoco" / "refs(unc).json").read_text()) == refs


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_make_tiny_model_commands_run(tmp_path):
    tiny = [c for c in ALL_COMMANDS if "make-tiny-model" in c]
    assert tiny
    for words in tiny:
        argv = [sys.executable, "-m", "vlm_grpoma.cli", *without_env(words)[1:]]
        result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        out = build_parser().parse_args(without_env(words)[1:]).out
        assert (tmp_path / out / "config.json").is_file()


#: ``<!-- output of: vlm-grpoma ARGS -->`` and the unlabelled block after it: (page, ARGS, the shown output)
SHOWN_OUTPUTS = [
    (page, args, shown)
    for page, text in PAGES.items()
    for args, shown in re.findall(
        r"^<!-- output of: vlm-grpoma (.+?) -->\n```\n(.*?)^```", text, re.MULTILINE | re.DOTALL
    )
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "page, args, shown", SHOWN_OUTPUTS, ids=lambda v: v[:50] if isinstance(v, str) else v
)
def test_shown_command_output_is_the_real_output(page, args, shown):
    """The block is what the command prints now (all of it, or the part shown, such as a help text's epilog)."""
    argv = [sys.executable, "-m", "vlm_grpoma.cli", *shlex.split(args)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shown.strip() in result.stdout, (
        f"{page}: the output of `vlm-grpoma {args}` changed; paste the new one"
    )


def test_outputs_are_marked_where_pages_show_them():
    assert {(page, args) for page, args, _ in SHOWN_OUTPUTS} >= {
        ("docs/scaling.md", "plan configs/detection/qwen2_vl_2b_T4A4.yaml"),
        ("docs/scaling.md", "plan --help"),
    }


def _config_reference_script():
    spec = importlib.util.spec_from_file_location(
        "config_reference", REPO / "scripts" / "config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_page_is_current_and_lists_every_leaf_key():
    from vlm_grpoma.config import config_reference

    script = _config_reference_script()
    page = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    assert page == script.render(config_reference()), (
        "docs/reference/config.md is stale: run make config-reference"
    )
    rows = re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE)
    assert rows == [doc.key for doc in config_reference()]
    assert {"rollout.num_thoughts", "rollout.answers_per_thought", "algorithm.kl_beta", "seed"} <= set(rows)


def test_config_reference_cells_survive_markdown():
    """A pipe, angle bracket or underscore in a doc line stays text: it neither splits the row nor opens a tag."""
    from vlm_grpoma.config import FieldDoc

    script = _config_reference_script()
    row = script.render(
        [FieldDoc("a.b_c", "dict[str, bool | int]", {"x": 1}, ">= 1", "KL(p || q) in <think>, *_mask")]
    )
    line = row.splitlines()[-1]
    assert (
        line
        == '| `a.b_c` | `dict[str, bool | int]` | `{"x": 1}` | >= 1 | KL(p \\|\\| q) in &lt;think>, \\*\\_mask |'
    )


def _build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` as ``make docs`` runs it (never ``--quiet``: it hides what strict fails on)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed (make docs installs it)"
)
def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    result = _build_site(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a", encoding="utf-8") as page:
        page.write("\n[a page that is not there](no-such-page.md)\n")
    broken = _build_site(copy / "mkdocs.yml", tmp_path / "broken-site")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stdout + broken.stderr
