"""A managed instance's command line on each engine: ik_llama.cpp is launched with
mainline's context rule (a prompt longer than the context is refused, not cut)."""

from __future__ import annotations

from pathlib import Path

from tuner.settings import Settings
from tuner.upstream.capabilities import parse_capabilities
from tuner.upstream.launch import HTTP_THREADS, router_argv, server_argv

DATA = Path(__file__).parent / "data"


def _argv(help_file: str, **settings: object) -> list[str]:
    caps = parse_capabilities((DATA / help_file).read_text())
    chosen = Settings(ctx_size=4096, **settings)  # type: ignore[arg-type]
    return server_argv(
        Path("/bin/llama-server"), chosen, caps, model=Path("/m.gguf"), draft=None, port=1
    )


def test_ik_llama_cpp_refuses_an_overlong_prompt_as_mainline_does() -> None:
    assert "--no-context-shift" in _argv("help-ik-55d3c05.txt")
    assert "--no-context-shift" not in _argv("help-0c1e570.txt")  # mainline: off by default
    # the user's own flags come last, and win
    argv = _argv("help-ik-55d3c05.txt", server_args=["--context-shift", "on"])
    assert argv[-2:] == ["--context-shift", "on"]


def test_every_server_answers_http_on_enough_threads_to_answer_a_probe_while_busy() -> None:
    threads = ["--threads-http", str(HTTP_THREADS)]
    for help_file in ("help-ik-55d3c05.txt", "help-0c1e570.txt"):
        argv = _argv(help_file)
        at = argv.index("--threads-http")
        assert argv[at : at + 2] == threads
    caps = parse_capabilities((DATA / "help-0c1e570.txt").read_text())
    router = router_argv(Path("/bin/llama-server"), Settings(), caps, Path("/p.ini"), 4, 1)
    assert router[-2:] == threads
    # a binary without the flag is not given it
    bare = parse_capabilities("usage: llama-server\n  --port N  port\n")
    assert "--threads-http" not in router_argv(Path("/b"), Settings(), bare, Path("/p.ini"), 1, 1)
