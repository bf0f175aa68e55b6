"""Learned policies moved between machines without a database (``tuner policies``).

An export is the policy file (per class the chosen variant and every variant's evidence,
plus the one-variant-at-a-time state) wrapped with a format name and version. An import
checks it against this machine: a file learned on another model, kind of machine or
llama.cpp build is refused, since its speedups do not carry over (the daemon would set it
aside at start). The policy file it replaces is set aside (renamed and kept), never
overwritten, and the state dir must not be in use by a running daemon, which would write
its own policies over the import.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.atomic import write_atomic
from tuner.errors import ConfigError, ProvisionError
from tuner.settings import Settings
from tuner.statedir import state_dir_lock
from tuner.tuning.runtime.policy_file import POLICY_FILE, migrate, read_document, set_aside

__all__ = ["FORMAT", "Machine", "export_policies", "import_policies", "refusal", "this_machine"]

FORMAT = "spec-tuner-policies"
FORMAT_VERSION = 1
# what a policy file says about where it was learned, besides its classes


@dataclass(frozen=True, slots=True)
class Machine:
    """What an import is checked against: this machine's model, hardware and the build of
    each engine the daemon may serve on (none installed yet: not checked)."""

    model: str
    model_key: str
    hardware_key: str
    builds: Mapping[str, str | None]  # engine -> its build's commit


def export_policies(state_dir: Path, target: Path) -> dict[str, Any]:
    """Write the state dir's learned policies to ``target``; returns the written document."""
    document = read_document(state_dir / POLICY_FILE)
    if document is None:
        raise ConfigError(f"no learned policies in {state_dir} (no readable {POLICY_FILE})")
    wrapped = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "exported": time.time(),
        "exported_from": socket.gethostname(),
        "policies": document,
    }
    write_atomic(target, json.dumps(wrapped, indent=1, sort_keys=True) + "\n")
    return wrapped


def refusal(wrapped: object, here: Machine) -> str | None:
    """Why this export cannot be imported here, or None when it can.

    >>> here = Machine("m", "m-1", "hw-1", {"llama.cpp": "abc"})
    >>> ok = {"format": FORMAT, "format_version": 1, "policies": {"version": 3,
    ...       "model_key": "m-1", "hardware_key": "hw-1", "build": "abc", "classes": {}}}
    >>> refusal(ok, here) is None
    True
    >>> refusal({**ok, "policies": {**ok["policies"], "model_key": "q-2"}}, here)
    'learned on another model (q-2); this daemon serves m (m-1)'
    """
    if not isinstance(wrapped, dict) or wrapped.get("format") != FORMAT:
        return f"not a {FORMAT} export"
    if wrapped.get("format_version") != FORMAT_VERSION:
        return f"export format version {wrapped.get('format_version')!r}, not {FORMAT_VERSION}"
    policies = migrate(wrapped.get("policies"))
    if policies is None:
        return "its policies are not of this version or an earlier one it migrates"
    if not isinstance(policies.get("classes"), dict):
        return "it holds no classes"
    if policies.get("model_key") != here.model_key:
        return (
            f"learned on another model ({policies.get('model_key')}); "
            f"this daemon serves {here.model} ({here.model_key})"
        )
    if policies.get("hardware_key") != here.hardware_key:
        return (
            f"learned on another kind of machine ({policies.get('hardware_key')}; "
            f"this one is {here.hardware_key}): its speedups do not carry over"
        )
    engine = policies.get("engine") or "llama.cpp"  # files before engines were named
    if here.builds and engine not in here.builds:
        return (
            f"learned on {engine}, which this daemon does not serve on "
            f"({', '.join(here.builds)}; tuner provision --engine {engine} builds it)"
        )
    build = here.builds.get(engine)
    if build is not None and policies.get("build") != build:
        return f"learned on {engine} build {policies.get('build')}; this one is {build}"
    return None


def import_policies(source: Path, state_dir: Path, here: Machine) -> dict[str, Any]:
    """Install an export as the state dir's policy file, once it is checked against this
    machine; returns what was imported (classes, and the file set aside, if any)."""
    try:
        wrapped = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {source}: {exc}") from exc
    why = refusal(wrapped, here)
    if why is not None:
        raise ConfigError(f"{source} not imported: {why}")
    state_dir.mkdir(parents=True, exist_ok=True)
    with state_dir_lock(state_dir, "import policies into"):
        path = state_dir / POLICY_FILE
        aside = set_aside(path, "replaced", by=str(source)) if path.exists() else None
        if path.exists():  # could not be renamed: never overwrite what was learned here
            raise ConfigError(f"{path} could not be set aside; nothing imported")
        document = migrate(wrapped["policies"])
        assert document is not None  # ``refusal`` checked it
        write_atomic(path, json.dumps(document, indent=1, sort_keys=True) + "\n")
    return {
        "classes": sorted(document["classes"]),
        "set_aside": str(aside) if aside else None,
        "from": wrapped.get("exported_from"),
    }


def this_machine(settings: Settings) -> Machine:
    """The keys an import is checked against: the configured model on this machine, and
    the builds of the engines installed here that the settings let the daemon serve on:
    the named binary's, the pinned engine's, or with ``auto`` every one built."""
    from tuner.profiles import fingerprint_key, hardware_fingerprint, model_key
    from tuner.upstream.capabilities import probe_capabilities
    from tuner.upstream.launch import model_alias, resolve_model
    from tuner.upstream.provision import built_engines, locate_llama_server
    from tuner.upstream.sources import ENGINES

    model, _ = resolve_model(settings)
    if settings.engine == "auto" and settings.llama_server is None:
        engines = built_engines(settings.cache_dir, settings.llama_cuda)
    else:  # a named binary is used whatever its engine
        engines = [next((e for e in ENGINES if e == settings.engine), ENGINES[0])]
    builds: dict[str, str | None] = {}
    for engine in engines:
        try:
            binary = locate_llama_server(
                settings.llama_server,
                settings.cache_dir,
                engine=engine,
                build=False,
                cuda=settings.llama_cuda,
            )
        except ProvisionError:
            continue
        caps = probe_capabilities(binary)
        builds[caps.engine] = caps.commit
    hardware = fingerprint_key(hardware_fingerprint())
    return Machine(model_alias(settings, model), model_key(model), hardware, builds)
