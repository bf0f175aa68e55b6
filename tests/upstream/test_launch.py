"""A managed instance's command line on each engine: ik_llama.cpp is launched with
mainline's context rule (a prompt longer than the context is refused, not cut)."""

from __future__ import annotations

from pathlib import Path

from tuner.settings import Settings
from tuner.upstream.capabilities import parse_capabilities
from tuner.upstream.launch import server_argv

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
