"""``tuner policies export`` / ``import``: the file, the checks, nothing learned lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import ConfigError
from tuner.statedir import state_dir_lock
from tuner.transfer import Machine, export_policies, import_policies, refusal
from tuner.tuning.runtime.policy_file import POLICY_FILE, VERSION, save_policies

HERE = Machine("gemma", "gemma-abc", "hw-1", {"llama.cpp": "c0ffee"})
META = {"model": "gemma", "model_key": "gemma-abc", "build": "c0ffee", "hardware_key": "hw-1"}
CLASSES = {
    "code/echo/greedy": {"policy": {"variant": "ngram-simple.n3.m16", "speculation": True}},
    "text/fresh/sampled": {"policy": {"variant": "none", "speculation": False}},
}


def _learned(state: Path, meta: dict[str, Any] | None = None) -> None:
    save_policies(state / POLICY_FILE, meta or META, CLASSES, extra={"single": {"windows": 2}})


def test_an_export_imported_on_a_machine_of_the_same_kind_is_the_policy_file(
    tmp_path: Path,
) -> None:
    _learned(tmp_path / "a")
    export_policies(tmp_path / "a", tmp_path / "export.json")
    done = import_policies(tmp_path / "export.json", tmp_path / "b", HERE)
    assert done["classes"] == sorted(CLASSES) and done["set_aside"] is None
    theirs = json.loads((tmp_path / "a" / POLICY_FILE).read_text())
    ours = json.loads((tmp_path / "b" / POLICY_FILE).read_text())
    assert ours == theirs  # classes, evidence and the one-variant-at-a-time state


def test_the_policies_an_import_replaces_are_kept_beside_it(tmp_path: Path) -> None:
    _learned(tmp_path / "a")
    export_policies(tmp_path / "a", tmp_path / "export.json")
    save_policies(tmp_path / "b" / POLICY_FILE, META, {"mine": {"policy": {}}})
    done = import_policies(tmp_path / "export.json", tmp_path / "b", HERE)
    kept = json.loads(Path(done["set_aside"]).read_text())
    assert list(kept["classes"]) == ["mine"]
    assert ".replaced." in done["set_aside"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_key": "qwen-123"}, "another model (qwen-123); this daemon serves gemma"),
        ({"hardware_key": "hw-2"}, "another kind of machine"),
        ({"build": "deadbee"}, "llama.cpp build deadbee; this one is c0ffee"),
    ],
)
def test_an_export_from_another_model_machine_or_build_is_refused(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    _learned(tmp_path / "a", META | change)
    export_policies(tmp_path / "a", tmp_path / "export.json")
    with pytest.raises(ConfigError, match=re.escape(message)):
        import_policies(tmp_path / "export.json", tmp_path / "b", HERE)
    assert not (tmp_path / "b" / POLICY_FILE).exists()


def test_the_build_is_not_checked_where_no_llama_server_is_installed_yet() -> None:
    wrapped = {
        "format": "spec-tuner-policies",
        "format_version": 1,
        "policies": {"version": VERSION, **META, "build": "other", "classes": {}},
    }
    assert refusal(wrapped, HERE) is not None
    assert refusal(wrapped, Machine("gemma", "gemma-abc", "hw-1", {})) is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": "spec-tuner-policies", "format_version": 9}',
        '{"format": "spec-tuner-policies", "format_version": 1, "policies": {"version": 1}}',
    ],
)
def test_a_file_that_is_not_an_export_is_refused_and_nothing_changes(
    tmp_path: Path, text: str
) -> None:
    (tmp_path / "export.json").write_text(text)
    save_policies(tmp_path / "b" / POLICY_FILE, META, {"mine": {"policy": {}}})
    with pytest.raises(ConfigError, match=r"export\.json"):
        import_policies(tmp_path / "export.json", tmp_path / "b", HERE)
    assert list(json.loads((tmp_path / "b" / POLICY_FILE).read_text())["classes"]) == ["mine"]


def test_exporting_a_state_dir_that_learned_nothing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no learned policies"):
        export_policies(tmp_path, tmp_path / "export.json")


def _hold(state: str, held: Any, release: Any) -> None:
    with state_dir_lock(Path(state)):
        held.set()
        release.wait(30)


def test_no_import_into_a_state_dir_a_daemon_is_using(tmp_path: Path) -> None:
    """The lock is held by another process, as a running daemon holds it."""
    _learned(tmp_path / "a")
    export_policies(tmp_path / "a", tmp_path / "export.json")
    context = multiprocessing.get_context("spawn")
    held, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(tmp_path / "b"), held, release))
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            import_policies(tmp_path / "export.json", tmp_path / "b", HERE)
    finally:
        release.set()
        holder.join(30)
    assert not (tmp_path / "b" / POLICY_FILE).exists()
    import_policies(tmp_path / "export.json", tmp_path / "b", HERE)  # free once it stops


def test_a_lock_dies_with_its_process(tmp_path: Path) -> None:
    """kill -9 of the holder leaves nothing to clean up (the kernel drops an flock)."""
    code = "import sys, time, pathlib\nfrom tuner.statedir import state_dir_lock\n"
    code += "with state_dir_lock(pathlib.Path(sys.argv[1])):\n"
    code += "    print('held', flush=True); time.sleep(60)\n"
    with subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="a daemon"), state_dir_lock(tmp_path):
            pass
        holder.kill()
    with state_dir_lock(tmp_path):
        assert (tmp_path / "daemon.lock").read_text().strip() == str(os.getpid())


def test_a_state_dir_that_refuses_writes_is_served_without_the_lock(tmp_path: Path) -> None:
    """The daemon keeps serving where it cannot write (the lock is not worth an outage)."""
    blocked = tmp_path / "a-file"
    blocked.write_text("where the state dir should be")
    with state_dir_lock(blocked / "state"):
        pass  # no error: entered unlocked


def test_the_example_export_in_policies_is_one_this_version_imports() -> None:
    """``policies/example-export.json`` (a real export, cut short for reading) stays in step
    with the policy file's layout: refused only on another machine, and every class in it
    parses as the engine restores it."""
    from tuner.tuning.evidence.classes import parse_class

    path = Path(__file__).resolve().parents[1] / "policies" / "example-export.json"
    wrapped = json.loads(path.read_text())
    policies = wrapped["policies"]
    learned_on = Machine(
        policies["model"],
        policies["model_key"],
        policies["hardware_key"],
        {policies.get("engine") or "llama.cpp": policies["build"]},
    )
    assert refusal(wrapped, learned_on) is None
    assert refusal(wrapped, HERE) is not None
    for key, data in policies["classes"].items():
        state = parse_class(key, data)
        assert state.policy is not None and state.policy.class_key == key


def test_an_export_of_the_previous_version_is_migrated_and_served(tmp_path: Path) -> None:
    """``tests/data/policies-export-v2.json`` was written by version 2 (8d3f957: a
    simulated engine's policy file with a fleet outbox, exported): it imports, its fleet
    events are migrated, and an engine restores every class of it as that version had it."""
    from tests.tuning.sim import config, make
    from tuner.tuning.evidence.classes import parse_class
    from tuner.tuning.runtime import events
    from tuner.tuning.runtime.policy_file import load_policies
    from tuner.upstream.capabilities import parse_capabilities

    source = Path(__file__).parent / "data" / "policies-export-v2.json"
    old = json.loads(source.read_text())["policies"]
    assert old["version"] == VERSION - 1
    here = Machine(
        "gemma-3-270m", old["model_key"], old["hardware_key"], {"llama.cpp": old["build"]}
    )
    done = import_policies(source, tmp_path / "state", here)
    assert done["classes"] == sorted(old["classes"])
    document = json.loads((tmp_path / "state" / POLICY_FILE).read_text())
    assert document["version"] == VERSION
    outbox = document["fleet"]["outbox"]
    assert [e[2]["version"] for e in outbox] == [events.VERSION] * len(old["fleet"]["outbox"])
    assert [events.parse(e[2]) for e in outbox] == [
        events.parse(e[2]) for e in old["fleet"]["outbox"]
    ]
    classes = load_policies(
        tmp_path / "state" / POLICY_FILE,
        {k: old[k] for k in ("model_key", "build", "hardware_key")},
    )
    assert sorted(classes) == sorted(old["classes"])
    help_text = (Path(__file__).parent / "upstream" / "data" / "help-0c1e570.txt").read_text()
    engine = make(tmp_path / "engine", config(), parse_capabilities(help_text))
    engine.restore(classes)
    for key, data in old["classes"].items():
        was, now = parse_class(key, data), engine.state(key)
        assert (now.seen, now.spent, now.trials_done) == (was.seen, was.spent, was.trials_done)
        assert {n: a.dump() for n, a in now.arms.items()} == {
            n: a.dump() for n, a in was.arms.items()
        }
        assert was.policy is not None and now.policy is not None
        assert now.policy.variant == was.policy.variant


def test_an_export_is_checked_against_the_build_of_the_engine_it_was_learned_on() -> None:
    """Learned on ik_llama.cpp: a daemon that serves on either engine (auto) takes it where
    its ik_llama.cpp build is the same; one pinned to mainline names the engine it lacks."""
    wrapped = {
        "format": "spec-tuner-policies",
        "format_version": 1,
        "policies": {"version": VERSION, **META, "engine": "ik_llama.cpp", "build": "55d3c05"},
    }
    wrapped["policies"]["classes"] = {}
    both = Machine("gemma", "gemma-abc", "hw-1", {"llama.cpp": "c0ffee", "ik_llama.cpp": "55d3c05"})
    assert refusal(wrapped, both) is None
    newer = {**both.builds, "ik_llama.cpp": "8337e4c"}
    assert refusal(wrapped, Machine("gemma", "gemma-abc", "hw-1", newer)) == (
        "learned on ik_llama.cpp build 55d3c05; this one is 8337e4c"
    )
    why = refusal(wrapped, HERE)
    assert why is not None and "tuner provision --engine ik_llama.cpp" in why
