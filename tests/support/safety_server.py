"""A stand-in server process for tests/safety/test_safety.py (run as a script, never imported).

    python safety_server.py DIR [--engine-child] [ANY EXTRA ARGUMENTS ...]

Serves GET /metrics on 127.0.0.1 (a free port) with the bytes of DIR/body.prom, read afresh
for every request so a test can change what the "server" says. Writes DIR/port and
DIR/pid once it listens. Extra arguments are ignored: tests put secrets on its command
line. With --engine-child it also starts a child titled `VLLM::EngineCore`, so that its
process tree looks like vLLM's (otherwise it is an unrelated process that only happens
to listen on the target's port). DIR/exit makes it exit (a crash: the port is refused).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _engine_child() -> None:
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.2)


def main() -> None:
    if sys.argv[1] == "--engine":
        _engine_child()
        return
    directory = Path(sys.argv[1])
    if "--engine-child" in sys.argv[2:]:
        subprocess.Popen([sys.executable, __file__, "--engine"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (directory / "body.prom").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    (directory / "port.tmp").write_text(str(server.server_address[1]))
    (directory / "port.tmp").rename(directory / "port")
    (directory / "pid").write_text(str(os.getpid()))
    while not (directory / "exit").exists():
        time.sleep(0.05)
    os._exit(1)


if __name__ == "__main__":
    main()
