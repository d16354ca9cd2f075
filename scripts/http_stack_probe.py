"""Why the rollout server stays on ``http.server``: one slow-caller probe against it and against uvicorn.

Each stack gets the same bounds (4 connections, 2 s for a silent caller where it has such a setting); 4 callers
send half a request and go silent; 5 s later a fifth caller asks ``GET /health``. A stack that drops silent
callers answers it; one that does not is locked out for as long as the silent callers choose. Run it with the
vLLM venv's Python (uvicorn is part of vLLM's stack, not of the main venv):
``.venv-vllm/bin/python scripts/http_stack_probe.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

PORT_OURS, PORT_UVICORN = 18771, 18772
SILENT_CALLERS, SILENCE_S, TIMEOUT_S = 4, 5.0, 2


def start_ours(port: int) -> None:
    """The rollout server's own HTTP layer, with its health endpoint and no engine behind it."""
    from vlm_grpoma.rollout.server.service import BoundedHTTPServer, RolloutService, handler_for

    handler = handler_for(RolloutService(None, {"model": "probe"}))  # type: ignore[arg-type]
    handler.timeout = TIMEOUT_S
    server = BoundedHTTPServer(("127.0.0.1", port), handler, max_connections=SILENT_CALLERS)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def start_uvicorn(port: int) -> None:
    """uvicorn with the closest settings it has: limit_concurrency and timeout_keep_alive."""
    import uvicorn

    async def app(scope, receive, send):  # noqa: ANN001 (a bare ASGI app: nothing else is measured)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        limit_concurrency=SILENT_CALLERS,
        timeout_keep_alive=TIMEOUT_S,
        log_level="error",
    )
    threading.Thread(target=uvicorn.Server(config).run, daemon=True).start()


def probe(start: Callable[[int], None], port: int) -> str:
    """The status line a fresh caller gets while silent callers hold every slot (or what went wrong)."""
    start(port)
    time.sleep(1.0)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(SILENT_CALLERS)]
    for connection in silent:
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\n")  # no blank line: the headers never end
    time.sleep(SILENCE_S)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as fresh:
            fresh.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\n\r\n")
            return fresh.recv(200).split(b"\r\n")[0].decode() or "(connection closed)"
    except OSError as err:
        return f"({type(err).__name__})"
    finally:
        for connection in silent:
            connection.close()


def main() -> None:
    print(
        f"{SILENT_CALLERS} callers send half a request and go silent; {SILENCE_S:g} s later a fresh caller gets:"
    )
    print(f"  http.server (rollout server, {TIMEOUT_S} s timeout): {probe(start_ours, PORT_OURS)}")
    try:
        import uvicorn
    except ImportError:
        print("  uvicorn: not installed here (run with the vLLM venv's Python)")
        return
    print(
        f"  uvicorn {uvicorn.__version__} (timeout_keep_alive={TIMEOUT_S}): {probe(start_uvicorn, PORT_UVICORN)}"
    )


if __name__ == "__main__":
    main()
