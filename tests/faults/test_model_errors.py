"""A model that cannot be loaded is one line naming ``model.name_or_path`` or the damaged file, in every command
that loads one (train, sft, eval, check-data), never a transformers / huggingface_hub / safetensors traceback,
and offline an uncached hub id is refused at once (no retry loop)."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fault_runs import error_lines, run_cli

from vlm_grpoma.config import ModelConfig
from vlm_grpoma.errors import UserError
from vlm_grpoma.models import model_files
from vlm_grpoma.models.loading import load_pretrained
from vlm_grpoma.models.registry import load_adapter

UNCACHED = "vlm-grpoma-tests/not-a-cached-model"


def _truncate(folder: Path) -> str:
    """Cut the model's weights file in half (a copy that stopped midway); returns its path."""
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return str(weights)


def _break_config(folder: Path) -> str:
    """Cut the end off the model's config.json; returns its path."""
    config = folder / "config.json"
    config.write_text(config.read_text()[:-40])
    return str(config)


def _damaged(damage: str, model: Path) -> str:
    """The ``model.name_or_path`` a user with this damage passes (``model``: a copy of the tiny model)."""
    if damage == "truncated model.safetensors":
        _truncate(model)
    elif damage == "damaged config.json":
        _break_config(model)
    names = {
        "missing local folder": str(model.parent / "no-such-model"),
        "empty name": "  ",
        "run folder, not its model": str(model.parent),
        "uncached hub id offline": UNCACHED,
    }
    return names.get(damage, str(model))


#: damage -> what its one line says
DAMAGE = {
    "missing local folder": "no such folder",
    "empty name": "model.name_or_path: empty",
    "run folder, not its model": "has no config.json",
    "uncached hub id offline": "HF_HUB_OFFLINE",
    "truncated model.safetensors": "model.safetensors: damaged or truncated",
    "damaged config.json": "config.json: not valid JSON",
}


@pytest.fixture
def model_copy(tiny_path, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_path, tmp_path / "run" / "model"))


@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_unloadable_model_is_one_line_naming_the_key_or_file(damage, model_copy, offline):
    expected = DAMAGE[damage]
    config = replace(ModelConfig(), name_or_path=_damaged(damage, model_copy))
    for load in (lambda: load_adapter(config), lambda: load_pretrained(config, "auto")):
        with pytest.raises(UserError) as raised:
            load()
        message = str(raised.value)
        assert expected in message and "\n" not in message, message
        assert "model.name_or_path" in message or str(model_copy) in message, message


def test_an_intact_model_passes_the_checks(model_copy, offline):
    model_files.check_model_source(str(model_copy))
    header = json.loads((model_copy / "config.json").read_text())
    assert header["model_type"]  # the check read the real config


def test_offline_an_uncached_hub_id_is_refused_before_any_lookup(offline, monkeypatch):
    """No retry loop: check-data spent 34 s in hub retries before this."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    start = time.monotonic()
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        load_adapter(replace(ModelConfig(), name_or_path=UNCACHED))
    assert time.monotonic() - start < 2


class _StandInHub(http.server.BaseHTTPRequestHandler):
    """A hub that knows one model: ``/api/models/<KNOWN>`` is 200, every other id 401 (as the real hub answers
    an unknown id to a caller without a token); each request is counted."""

    requests: list[str] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        self.send_response(200 if self.path == f"/api/models/{KNOWN}" else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        pass


KNOWN = "vlm-grpoma-tests/known-model"


@pytest.fixture
def online_hub(monkeypatch):
    """``HF_ENDPOINT`` pointed at a stand-in hub on a loopback port, online (no HF_HUB_OFFLINE)."""
    from huggingface_hub import constants

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandInHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    _StandInHub.requests = []
    yield _StandInHub.requests
    server.shutdown()
    server.server_close()


def test_online_a_mistyped_hub_id_is_one_line_after_one_request(online_hub):
    """Before: transformers asked the hub for config.json and raised a traceback about a repository not found."""
    with pytest.raises(UserError) as raised:
        model_files.check_model_source(UNCACHED)
    message = str(raised.value)
    assert message.startswith(f"model.name_or_path: {UNCACHED}: no such model on http://127.0.0.1:"), message
    assert "\n" not in message and online_hub == [f"/api/models/{UNCACHED}"]
    model_files.check_model_source(KNOWN)  # a model the hub knows is left to the download
    assert online_hub[-1] == f"/api/models/{KNOWN}"


def test_online_an_unreachable_hub_is_one_line_at_once(monkeypatch):
    """Before: five retries over half a minute, then a traceback. Now one refused connection, then one line
    that points at HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(UserError) as raised:
        load_adapter(replace(ModelConfig(), name_or_path=UNCACHED))
    message = str(raised.value)
    assert time.monotonic() - start < 3
    assert f"model.name_or_path: {UNCACHED}: cannot reach http://127.0.0.1:{port}" in message, message
    assert "set HF_HUB_OFFLINE=1" in message and "\n" not in message


def _assert_one_line(done, *needles: str) -> str:
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = error_lines(done.stderr)
    assert all(n in line for n in needles), line
    return line


def _train(command: str, tmp_path: Path, overrides: list[str]):
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    return run_cli(command, "--config", str(config), *overrides)


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_train_and_sft_with_a_mistyped_model_path_are_one_line(overrides, tmp_path):
    typo = str(tmp_path / "modle")
    for command in ("train", "sft"):
        done = _train(command, tmp_path, overrides(tmp_path / command, f"model.name_or_path={typo}"))
        _assert_one_line(done, "model.name_or_path", typo)


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_train_with_a_truncated_safetensors_is_one_line_naming_the_file(overrides, model_copy, tmp_path):
    weights = _truncate(model_copy)
    done = _train("train", tmp_path, overrides(tmp_path / "out", f"model.name_or_path={model_copy}"))
    _assert_one_line(done, weights, "damaged or truncated")


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_eval_of_a_checkpoint_with_a_damaged_config_is_one_line(model_copy, shapes_path):
    config = _break_config(model_copy)
    done = run_cli(
        "eval", "--checkpoint", str(model_copy), "--split", "train", f"data.eval_path={shapes_path}"
    )
    _assert_one_line(done, config)


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_check_data_checks_the_records_first_and_an_uncached_model_offline_at_once(shapes_path):
    done = run_cli("check-data", str(shapes_path), "--model", UNCACHED, env={"HF_HUB_OFFLINE": "1"})
    _assert_one_line(done, "model.name_or_path", UNCACHED, "HF_HUB_OFFLINE")
    assert done.stdout.startswith("records: 8 valid of 8 read"), done.stdout  # the records were checked first
