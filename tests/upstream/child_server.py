"""A stand-in child process for supervisor tests: serves /health after a delay.

Usage: child_server.py PORT [DELAY_S] [--exit CODE] [--grandchild PIDFILE]
It only has to behave like a process that listens and answers /health; the
real llama-server is exercised in tests/integration.
"""

from __future__ import annotations

import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status":"ok"}' if self.path == "/health" else b'{"data":[{"id":"child"}]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    args = sys.argv[1:]
    port = int(args[0])
    delay = float(args[1]) if len(args) > 1 and not args[1].startswith("--") else 0.0
    if "--exit" in args:
        print("fatal: cannot load model", flush=True)
        sys.exit(int(args[args.index("--exit") + 1]))
    if "--grandchild" in args:
        child = subprocess.Popen(["sleep", "300"])
        with open(args[args.index("--grandchild") + 1], "w") as handle:
            handle.write(str(child.pid))
    time.sleep(delay)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
