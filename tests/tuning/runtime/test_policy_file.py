"""The policy file per engine: switching engines parks one engine's learning and brings
back the other's, so neither starts from the other's prices nor loses its own."""

from __future__ import annotations

from pathlib import Path

from tuner.tuning.runtime.policy_file import (
    load_policies,
    parked,
    read_document,
    save_policies,
    study_scope,
)

MAIN = {"model_key": "m", "build": "0c1e570", "hardware_key": "h", "engine": "llama.cpp"}
IK = {"model_key": "m", "build": "55d3c05", "hardware_key": "h", "engine": "ik_llama.cpp"}


def test_each_engine_gets_its_own_learning_back_after_a_switch(tmp_path: Path) -> None:
    path = tmp_path / "policies.json"
    save_policies(path, MAIN, {"code": {"learned": "on mainline"}})
    assert load_policies(path, IK) == {}  # ik starts fresh: mainline's is parked
    assert not path.exists()
    assert read_document(parked(path, "llama.cpp"))["classes"] == {  # type: ignore[index]
        "code": {"learned": "on mainline"}
    }
    save_policies(path, IK, {"code": {"learned": "on ik"}})
    assert load_policies(path, MAIN) == {"code": {"learned": "on mainline"}}  # back again
    assert read_document(path)["engine"] == "llama.cpp"  # type: ignore[index]
    assert load_policies(path, IK) == {"code": {"learned": "on ik"}}
    assert not list(tmp_path.glob("policies.*.old.json"))  # nothing set aside as stale


def test_a_new_build_of_the_same_engine_is_still_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "policies.json"
    save_policies(path, IK, {"code": {}})
    assert load_policies(path, {**IK, "build": "8337e4c"}) == {}
    assert list(tmp_path.glob("policies.*.old.json"))


def test_studies_are_scoped_per_engine_and_mainline_keeps_its_old_scope() -> None:
    assert study_scope(MAIN) == "m@h"  # as before a second engine was
    assert study_scope(IK) == "m@h@ik_llama.cpp"
    assert study_scope({"model_key": "m", "hardware_key": "h"}) == "m@h"
