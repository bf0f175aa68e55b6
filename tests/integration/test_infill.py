"""``/infill`` tuned on the real server: a code model with fill-in-the-middle tokens.

Gemma 3 has none, so the model here is a small random-weight one written with StarCoder's
vocabulary (``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``): its text is noise, but
the route, the class and the variant are the daemon's, on the engine beneath the suite.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningDaemon, start_daemon
from tuner.model.gguf_facts import read_facts
from tuner.settings import Settings
from tuner.synthetic.moe import SynthSpec, write_moe
from tuner.upstream.provision import default_vocab

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test

SPEC = SynthSpec(experts=16, active=2, layers=2, hidden=128, expert_ffn=128)
FIM = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n"}


def test_infill_is_classified_routed_and_answered(tmp_path: Path) -> None:
    vocab = default_vocab(Settings().cache_dir, "starcoder")
    model = write_moe(tmp_path / "coder.gguf", vocab, SPEC, dense=True)
    assert read_facts(model).fim
    state = tmp_path / "state"
    state.mkdir()
    daemon = start_daemon(state, env={"TUNER_MODEL": str(model)})
    for _ in range(3):
        response = httpx.post(daemon.url + "/infill", json={**FIM, "n_predict": 8}, timeout=120)
        assert response.status_code == 200, response.text
        assert isinstance(response.json()["content"], str)
        assert response.headers["x-spec-class"].startswith("code/echo/")
        assert response.headers["x-spec-variant"]


def test_infill_on_a_model_without_its_tokens_is_a_400_not_a_crash(
    daemon: RunningDaemon,
) -> None:
    """Gemma 3 has no FIM tokens: mainline says 501, ik_llama.cpp 55d3c05 aborts on it."""
    url = daemon.url
    for _ in range(2):
        response = httpx.post(url + "/infill", json={**FIM, "n_predict": 4}, timeout=60)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "not_supported"
    assert httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).is_success
