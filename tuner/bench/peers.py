"""A peer's llama-server beside the matrix: another build (ik_llama.cpp's, say) answering the
same prompts, one server per arm, so its own tuning (``--spec-autotune``) learns from the
run's stream as the tuner does.

Every peer arm is named ``peer:NAME``; ``peer:none`` (the peer's binary without speculation)
is always run, and each peer arm's ratio is over it: two binaries decode at different
speeds, so each is compared with itself. Peer arms are not static arms of this build: they
never enter the oracle or the best static arm.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from tuner.bench.rows import PEER_BASELINE, PEER_PREFIX
from tuner.errors import ConfigError
from tuner.settings import Settings
from tuner.upstream.client import UpstreamClient
from tuner.upstream.process import ManagedServer, free_port

__all__ = ["parse_peer_arm", "peer_argv", "peer_env", "peer_options", "peer_servers"]


def parse_peer_arm(text: str) -> tuple[str, tuple[str, ...]]:
    """``NAME=FLAGS`` (the peer's llama-server flags for this arm, shell-quoted) as the arm's
    name (``peer:NAME``) and its flags.

    >>> parse_peer_arm("mod+autotune=--spec-type ngram-mod --spec-autotune")
    ('peer:mod+autotune', ('--spec-type', 'ngram-mod', '--spec-autotune'))
    """
    name, sep, flags = text.partition("=")
    name = name.strip()
    if not sep or not name or any(c in name for c in " ,:/"):
        raise ConfigError(
            f"--peer-arm {text!r}: expected NAME=FLAGS, e.g. "
            "'ngram-mod+autotune=--spec-type ngram-mod --spec-autotune'"
        )
    if name == "none":
        raise ConfigError("--peer-arm none: the peer's run without speculation is always there")
    try:
        argv = tuple(shlex.split(flags))
    except ValueError as exc:
        raise ConfigError(f"--peer-arm {text!r}: {exc}") from exc
    return PEER_PREFIX + name, argv


def peer_options(
    peer: str | None, arm_texts: Sequence[str]
) -> tuple[Path | None, tuple[tuple[str, tuple[str, ...]], ...]]:
    """``--peer`` and its ``--peer-arm``s, checked before anything starts."""
    if arm_texts and not peer:
        raise ConfigError("--peer-arm NAME=FLAGS needs --peer LLAMA_SERVER")
    if not peer:
        return None, ()
    binary = Path(peer).expanduser().resolve()
    if not binary.is_file():
        raise ConfigError(f"--peer {peer}: no such file")
    arms = tuple(parse_peer_arm(text) for text in arm_texts)
    names = [name for name, _ in arms]
    if len(set(names)) < len(names):
        raise ConfigError(f"--peer-arm: a name used twice ({', '.join(names)})")
    return binary, arms


def peer_argv(
    binary: Path, settings: Settings, model: Path, flags: Sequence[str], port: int
) -> list[str]:
    """One peer llama-server: the model, context and threads this build's servers get, one
    slot (so a per-slot tuner such as ``--spec-autotune`` learns from every request), then
    the arm's flags."""
    argv = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(settings.ctx_size),
        "-np",
        "1",
    ]
    if settings.threads is not None:
        argv += ["--threads", str(settings.threads)]
    return argv + list(flags)


def peer_env(binary: Path) -> dict[str, str]:
    """This process's environment with the binary's folder first on ``LD_LIBRARY_PATH``: a
    build copied out of its tree keeps its shared libraries beside it."""
    env = dict(os.environ)
    found = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(binary.resolve().parent) + (f":{found}" if found else "")
    return env


@asynccontextmanager
async def peer_servers(
    binary: Path,
    arms: Mapping[str, Sequence[str]],
    settings: Settings,
    model: Path,
    workdir: Path,
) -> AsyncIterator[dict[str, str]]:
    """Start ``peer:none`` and every arm's server (logs ``peer-NAME.log`` in ``workdir``);
    their URLs by arm. One that does not start stops the ones started before it."""
    if not binary.is_file():
        raise ConfigError(f"--peer {binary}: no such file")
    env = peer_env(binary)
    async with contextlib.AsyncExitStack() as stack:
        urls: dict[str, str] = {}
        for arm, flags in {PEER_BASELINE: (), **arms}.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            client = UpstreamClient(url, read_timeout_s=settings.request_timeout_s)
            stack.push_async_callback(client.aclose)
            server = ManagedServer(
                peer_argv(binary, settings, model, flags, port),
                client,
                env=env,
                log_path=workdir / f"peer-{arm.removeprefix(PEER_PREFIX)}.log",
            )
            stack.push_async_callback(server.stop)
            await server.start()
            await server.wait_ready(settings.startup_timeout_s)
            urls[arm] = url
        yield urls
