"""A real PostgreSQL server for the tests: its own cluster in a temporary dir, on loopback.

Started from the Debian package's binaries (``.ci/run`` installs ``postgresql`` where it
is missing); as root, the server runs as the ``postgres`` user, since PostgreSQL refuses
to run as root. ``stop`` and ``start`` again keep the data (a database restart).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psycopg

__all__ = ["PgServer", "pg_bin"]


def pg_bin(name: str) -> str | None:
    """A PostgreSQL binary: on PATH, else the newest under /usr/lib/postgresql."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self, root: Path) -> None:
        initdb, postgres = pg_bin("initdb"), pg_bin("postgres")
        if initdb is None or postgres is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.postgres = postgres
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            self._as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        subprocess.run(
            [
                *self._as_user,
                initdb,
                "-D",
                str(self.data),
                "-U",
                "tuner",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )

    @property
    def url(self) -> str:
        return f"postgresql://tuner@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        with open(self.root / "server.log", "ab") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [
                    *self._as_user,
                    self.postgres,
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.root}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((self.root / "server.log").read_text()[-2000:]) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """A fast shutdown: clients are disconnected, the data kept."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
