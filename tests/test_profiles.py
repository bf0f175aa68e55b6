"""Checked-in profiles validate; saved profiles round-trip atomically; keys are stable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.model.envelope import cost_model
from tuner.model.speedup import verdict
from tuner.profiles import (
    Profile,
    TargetFacts,
    VariantCheck,
    fingerprint_key,
    load_profile,
    load_target,
    model_key,
    save_profile,
)

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_every_checked_in_file_validates() -> None:
    targets = list((PROFILES / "targets").glob("*.json"))
    assert targets
    for path in targets:
        TargetFacts.model_validate_json(path.read_text())
    for path in PROFILES.glob("*.json"):
        Profile.model_validate_json(path.read_text())


def test_small_active_moe_target_starts_with_speculation_off() -> None:
    """Qwen3.6-35B-A3B with the seeds' draft cost: no acceptance makes a draft pay."""
    facts = load_target("qwen3.6-35b-a3b", [PROFILES])
    assert facts.draft_cost_measured is not None
    for c in facts.draft_cost_measured:
        cost = cost_model(
            draft_step=c,
            experts=facts.experts,
            active=facts.experts_used,
            expert_fraction=facts.expert_fraction,
            state_ratio=facts.state_ratio,
        )
        for alpha in (0.55, 0.7, 0.8):
            assert not verdict(alpha, cost).pays


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"qwen3\.6-35b-a3b"):
        load_target("nope", [PROFILES])


def test_profile_round_trip(tmp_path: Path) -> None:
    profile = Profile(
        model_key="m-1",
        model_name="m",
        hardware_key="h",
        hardware={"cpu": "x"},
        decode_ms=15.0,
        verify_curve=[(1, 1.0), (8, 1.5)],
    )
    path = save_profile(tmp_path, profile)
    assert json.loads(path.read_text())["decode_ms"] == 15.0
    assert load_profile([tmp_path / "absent", tmp_path], "m-1", "h") == profile
    assert load_profile([tmp_path], "m-1", "other") is None
    assert profile.verify(4) == pytest.approx(1 + 0.5 * 3 / 7)
    assert not list(tmp_path.glob(".profile-*"))  # no temp files left behind


def test_keys_are_stable(tmp_path: Path) -> None:
    model = tmp_path / "x.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    assert model_key(model) == model_key(model)
    assert fingerprint_key({"cpu": "a", "cores": 2}) == fingerprint_key({"cores": 2, "cpu": "a"})
    assert fingerprint_key({"cpu": "a"}) != fingerprint_key({"cpu": "b"})


def _check(tokens: int, drafted: int, accepted: int, c: float, rounds: int = 10) -> VariantCheck:
    """A check whose measured speedup is what ``tokens`` cost at ``c`` per drafted token."""
    return VariantCheck(
        variant="v",
        flags=[],
        requests=1,
        tokens=tokens,
        rounds=rounds,
        alpha=accepted / drafted if drafted else None,
        mean_draft=drafted / rounds if drafted else None,
        measured_speedup=tokens / (tokens - accepted + c * drafted),
        predicted_speedup=None,
    )
