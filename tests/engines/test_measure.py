"""The engines' measurement with the servers faked: one client at a time by the servers'
own timings, then clients at once by the wall clock, so that an engine whose instance
takes concurrent clients in turn (one slot) is measured as such. The real engines' run is
``tests/integration/test_engines_real.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.engines.test_auto import CAPS
from tuner.engines import measure
from tuner.engines.choice import LOADED_CLIENTS, choose
from tuner.engines.measure import measure_engines
from tuner.settings import Settings
from tuner.upstream.launch import Prepared
from tuner.workload import WorkloadItem


class _Server:
    """A server of ``slots`` slots, each request ``step_s`` long: more wait for a slot."""

    def __init__(self, slots: int, step_s: float) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.step_s = step_s


async def _complete(server: _Server, prompt: str, n: int) -> dict[str, float]:
    async with server.slots:
        await asyncio.sleep(server.step_s)
    timed = server.step_s * 1000
    return {"prompt_n": 4, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": timed}


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> None:
    # ik_llama.cpp faster at one client, its one slot taking four in turn
    kinds = {"llama.cpp": (LOADED_CLIENTS, 0.02), "ik_llama.cpp": (1, 0.015)}

    @contextlib.asynccontextmanager
    async def server(binary: Path, *args: Any) -> AsyncIterator[_Server]:
        yield _Server(*kinds[binary.parent.name])

    monkeypatch.setattr(measure, "temporary_server", server)
    monkeypatch.setattr(measure, "_complete", _complete)


async def test_one_slot_is_measured_as_one_slot_when_clients_come_at_once(
    servers: None, tmp_path: Path
) -> None:
    prepared = [Prepared(Path(f"/{e}/llama-server"), CAPS[e], Path("/m.gguf"), None) for e in CAPS]
    prompts = [WorkloadItem(id=str(i), prompt=f"p{i}", max_tokens=8) for i in range(8)]
    results = await measure_engines(prepared, Settings(state_dir=tmp_path), prompts)
    found = {r.engine: r for r in results}
    main, ik = found["llama.cpp"], found["ik_llama.cpp"]
    assert ik.tok_s and main.tok_s and ik.tok_s > 1.2 * main.tok_s  # by the servers' timings
    assert main.loaded_tok_s and ik.loaded_tok_s
    assert main.loaded_tok_s > 2 * ik.loaded_tok_s  # four slots against one, in turn
    engine, why = choose(results, None)
    assert engine == "ik_llama.cpp"
    assert f"with {LOADED_CLIENTS} clients at once llama.cpp is faster" in why
