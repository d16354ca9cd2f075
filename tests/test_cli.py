"""The command table, the honest 'not available yet' path, and `vlm-grpoma env`."""

import json

import pytest

from vlm_grpoma import cli

DESIGN_COMMANDS = {
    "demo",
    "train",
    "sft",
    "eval",
    "manip-eval",
    "make-data",
    "convert",
    "make-tiny-model",
    "env",
}


def test_every_design_command_is_declared(capsys):
    assert {c.name for c in cli.COMMANDS} == DESIGN_COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DESIGN_COMMANDS)


def test_missing_implementation_says_so_and_exits_2(monkeypatch, capsys):
    missing = cli.Command(
        "env", "probe", "vlm_grpoma.not_built_yet:main", cli._env_args, arrives_with="#99 (x)"
    )
    monkeypatch.setattr(cli, "COMMANDS", (missing,))
    assert cli.main(["env"]) == 2
    assert (
        capsys.readouterr().err.strip() == "vlm-grpoma env: not available yet; it arrives with issue #99 (x)."
    )


def test_a_broken_import_inside_an_implementation_is_not_hidden(monkeypatch):
    broken = cli.Command("env", "probe", "vlm_grpoma.env_report:main", cli._env_args)
    monkeypatch.setattr(cli, "COMMANDS", (broken,))
    monkeypatch.setattr(
        cli.importlib,
        "import_module",
        lambda name: (_ for _ in ()).throw(ModuleNotFoundError("No module named 'scipy'", name="scipy")),
    )
    with pytest.raises(ModuleNotFoundError, match="scipy"):
        cli.main(["env"])


def test_env_json_without_probes(capsys):
    assert cli.main(["env", "--json", "--no-probe"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["packages"]["torch"] and report["packages"]["transformers"]
    assert report["devices"]["cpu_cores"] >= 1
    assert "probes" not in report
    assert report["vllm"]["known_good"]["vllm"].startswith("==")
    assert isinstance(report["vllm"]["departures"], list) and report["vllm"]["status"]


@pytest.mark.slow
def test_env_probes_report_deepspeed_and_sapien_physics(capsys):
    assert cli.main(["env", "--json"]) == 0
    probes = json.loads(capsys.readouterr().out)["probes"]
    assert probes["deepspeed_distributed"]["ok"], probes["deepspeed_distributed"]
    assert probes["sapien_physics"]["ok"], probes["sapien_physics"]
    assert set(probes["sapien_rendering"]) == {"ok", "detail"} and probes["sapien_rendering"]["detail"]
