"""A stand-in pool instance: answers /health, and every POST with what it was started with
and what it was sent; a streamed POST sends numbered events slowly, so that a test can kill
it in the middle.

Usage: pool_child.py FLAG... --port PORT   (``--fail`` among the flags: exit at once;
``--slow``: take a second and a half to start, as a model loads; ``--slow-stop``: a second
to stop; ``--drop-first``: close the first POST's connection without an answer, then take
a second and a half to answer ``/health``, as a live server on a loaded machine)
The real engine's pool is exercised in tests/integration/test_pool_real.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DROPPED: list[bool] = []  # ``--drop-first``: the first POST was dropped


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if DROPPED:
            time.sleep(1.5)
        self._json({"status": "ok", "path": self.path, "pid": os.getpid()})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if "--drop-first" in sys.argv and not DROPPED:
            DROPPED.append(True)
            self.close_connection = True
            return
        if body.get("stream"):
            self._stream()
            return
        if body.get("die"):  # dies on this request, before any byte of its answer
            os._exit(1)
        self._json({"argv": sys.argv[1:], "body": body, "path": self.path, "pid": os.getpid()})

    def _json(self, data: object) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for index in range(50):
            event = f"data: {json.dumps({'index': index, 'pid': os.getpid()})}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            time.sleep(0.1)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    args = sys.argv[1:]
    if "--fail" in args:
        print("fatal: cannot load the model", flush=True)
        sys.exit(1)
    port = int(args[args.index("--port") + 1])
    if "--slow" in args:
        time.sleep(1.5)
    if "--slow-stop" in args:  # as a model server finishing its requests
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), os._exit(0)))
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
