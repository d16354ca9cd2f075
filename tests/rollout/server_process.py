"""A real `vlm-grpoma rollout-server` subprocess for tests (the CPU vLLM build, in .venv-vllm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.distributed import free_port

#: The engine the tests run: float32 like the reference forward, eager, a small KV cache and context.
TEST_ENGINE = (
    "model.dtype=float32",
    "rollout.vllm.enforce_eager=true",
    "rollout.vllm.kv_cache_gib=0.25",
    "rollout.vllm.max_model_len=1024",
)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class ServerProcess:
    """A running server: its URL, process and log file."""

    url: str
    process: subprocess.Popen
    log: Path

    def health(self) -> dict:
        with _DIRECT.open(self.url + "/health", timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def start_server(model: Path, log: Path, *overrides: str, port: int | None = None) -> ServerProcess:
    """Start a server on ``model`` and wait until ``/health`` answers (its log's tail if it exits first)."""
    port = port or free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "vlm_grpoma.cli",
        "rollout-server",
        "--model",
        str(model),
        "--port",
        str(port),
    ]
    handle = log.open("w")
    process = subprocess.Popen(
        [*command, *TEST_ENGINE, *overrides], stdout=handle, stderr=subprocess.STDOUT, env=env
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rollout server exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.health()
            return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"rollout server did not answer /health within 300 s:\n{log.read_text()[-3000:]}")
