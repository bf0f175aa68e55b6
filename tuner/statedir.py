"""One writer per state dir: the daemon holds ``<state>/daemon.lock`` while it runs.

A second daemon on the same dir, or a policy import under a running daemon, would write
over what the first learned; both are refused with the holder's pid instead. The lock is
the kernel's (``flock``), so a daemon killed with -9 leaves nothing to clean up.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.errors import ConfigError

__all__ = ["LOCK_FILE", "state_dir_lock"]

LOCK_FILE = "daemon.lock"


@contextmanager
def state_dir_lock(state_dir: Path, doing: str = "serve from") -> Iterator[None]:
    """Hold the state dir's lock, or raise ConfigError naming the process that holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise ConfigError(
                f"cannot {doing} {state_dir}: a daemon (pid {holder}) is using it; "
                "stop it first, or use another state dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
