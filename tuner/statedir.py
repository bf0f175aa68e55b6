"""One writer per state dir: the daemon holds ``<state>/daemon.lock`` while it runs.

A second daemon on the same dir, or a policy import under a running daemon, would write
over what the first learned; both are refused with the holder's pid instead. The lock is
the kernel's (``flock``), so a daemon killed with -9 leaves nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.errors import ConfigError
from tuner.logs import get_logger

__all__ = ["LOCK_FILE", "state_dir_lock"]

log = get_logger(__name__)

LOCK_FILE = "daemon.lock"


@contextmanager
def state_dir_lock(state_dir: Path, doing: str = "serve from") -> Iterator[None]:
    """Hold the state dir's lock, or raise ConfigError naming the process that holds it."""
    path = state_dir / LOCK_FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a state dir that refuses writes: serving matters more
        log.warning("state_dir_unlocked", path=str(path), error=str(exc))
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise ConfigError(
                f"cannot {doing} {state_dir}: a daemon (pid {holder}) is using it; "
                "stop it first, or use another state dir"
            ) from None
        with contextlib.suppress(OSError):  # the pid is for the message only (a full disk)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
