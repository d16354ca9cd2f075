"""The launch layouts' wait for rollout servers: every URL answering, or one line saying which process ended
(with its log's last line) or which URL stayed silent past the bound."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vlm_grpoma.distributed import free_port
from vlm_grpoma.rollout.server.readiness import main, wait_for_servers


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_returns_once_every_server_answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert wait_for_servers([f"http://127.0.0.1:{server.server_port}"], 5, {}) is None
    finally:
        server.shutdown()


def test_a_silent_url_is_one_line_after_the_bound():
    url = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    assert wait_for_servers([url], 1, {}) == f"rollout server {url} did not answer within 1 s"
    assert time.monotonic() - began < 10


def test_a_watched_process_that_ended_is_named_with_its_logs_last_line(tmp_path, capsys):
    log = tmp_path / "server-0.log"
    log.write_text("loading\nvlm-grpoma rollout-server: error: model.name_or_path: no such folder\n")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--prefix", "train.sh: ", "--timeout-s", "60", "--watch", f"{ended.pid}={log}", url]) == 2
    assert capsys.readouterr().err == (
        f"train.sh: rollout server process {ended.pid} exited before serving ({log}): "
        "vlm-grpoma rollout-server: error: model.name_or_path: no such folder\n"
    )
