"""What an installed llama-server is and supports, read from ``--version`` and ``--help``.

The engine (mainline llama.cpp or ik_llama.cpp) is read from the help, never from the
binary's path: ik_llama.cpp lists flags of its own kernels (``--run-time-repack``,
``--fused-moe``) and prints its spec types in its own format. ``parse_capabilities`` is
pure (text in, value out) so it is tested on saved help texts of old and new builds of
both; ``probe_capabilities`` runs the binary.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.errors import ProvisionError
from tuner.upstream.build_info import read_build_info
from tuner.upstream.patches import COUNT_EMITTED
from tuner.upstream.sources import EngineName

__all__ = ["Capabilities", "engine_of", "parse_capabilities", "probe_capabilities"]

_SPEC_TYPE = re.compile(r"--spec-type\s+\[?([a-z0-9,|\-]+)\]?")
# ik_llama.cpp 55d3c05: "--spec-type Name [none | ngram - cache | ngram - simple | ...]"
_IK_SPEC_TYPE = re.compile(r"--spec-type\s+Name\s+\[([a-z0-9 |\-]+)\]")
# ik_llama.cpp from June 2026: "--spec-type SPEC[:k=v,...]", its types on a line of their own
_STAGES = re.compile(r"--spec-type\s+SPEC\[:k=v,\.\.\.\].*?types:\s*([a-z0-9, _\-]+)", re.S)
# its stage names -> the spec types spec-tuner knows them by (mainline's names)
_STAGE_TYPES = {
    "draft": "draft-simple",
    "mtp": "draft-mtp",
    "eagle3": "draft-eagle3",
    "dflash": "draft-dflash",
}
# flags only ik_llama.cpp has: its repacking and fused MoE kernels
_IK_FLAGS = frozenset({"--run-time-repack", "--fused-moe", "--no-fused-moe"})
# "version: 0.5.0-dev (build 1, commit 0c1e570)" (2026) or "version: 4567 (abc1234)" (older);
# a build from a source tree without git says "(build 0, commit unknown)"
_VERSION = re.compile(
    r"version:\s*(?P<version>\S+)\s*\((?:build\s+(?P<build>\d+),\s*commit\s+)?"
    r"(?P<commit>[0-9a-f]+|unknown)\)"
)
_HINT = re.compile(r"^[A-Z0-9_<>\[\]|{}.,:=-]+$|^[a-z0-9-]+(?:[,|][a-z0-9-]+)+$")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """One typed view of a llama-server build's features."""

    engine: EngineName
    version: str | None
    build: int | None
    commit: str | None
    spec_types: frozenset[str]
    new_spec_flags: bool  # --spec-draft-n-max, --spec-ngram-* ...
    old_draft_flags: bool  # --draft-max, --draft-min, --draft-p-min still work
    stages: bool  # ik_llama.cpp's --spec-type TYPE:k=v,... (its per-type flags refused)
    router: bool  # --models-preset
    metrics: bool  # --metrics
    autotune: bool  # --spec-autotune: the engine tunes draft settings per step itself
    flags: frozenset[str]
    patches: frozenset[str] = frozenset()  # fixes the build was made with (``patches``)

    @property
    def cuts_last_round(self) -> bool:
        """Whether an answer that reaches max_tokens leaves out its last verify round's
        accepted drafts (ik_llama.cpp without ``COUNT_EMITTED``); its usage counts them."""
        return self.engine == "ik_llama.cpp" and COUNT_EMITTED.name not in self.patches

    @property
    def batches(self) -> bool:
        """Whether an instance decodes concurrent requests together: mainline's default
        slots do; ik_llama.cpp's instance runs one slot (``--parallel 2`` aborts 55d3c05 on
        Gemma 3), so a request for its variant queues there while another decodes."""
        return self.engine != "ik_llama.cpp"

    def supports_spec_type(self, name: str) -> bool:
        return name in self.spec_types

    def has_flag(self, flag: str) -> bool:
        return flag in self.flags


def _flags_with_descriptions(help_text: str) -> dict[str, str]:
    """Map every flag spelled in the help to the description that follows it.

    A flag line starts with ``-``: flags (``-a,``, ``--alias``), then value
    hints (``N``, ``FNAME``, ``none,draft-simple,...``), then the description.
    """
    found: dict[str, str] = {}
    for line in help_text.splitlines():
        tokens = line.split()
        if not tokens or not tokens[0].startswith("-"):
            continue
        names: list[str] = []
        rest = 0
        for rest, token in enumerate(tokens):  # noqa: B007
            name = token.rstrip(",")
            if name.startswith("-") and len(name) > 1:
                names.append(name)
            elif not _HINT.match(token):
                break
        else:
            rest = len(tokens)
        description = " ".join(tokens[rest:])
        for name in names:
            found.setdefault(name, description)
    return found


def _engine(flags: dict[str, str]) -> EngineName:
    return "ik_llama.cpp" if _IK_FLAGS & flags.keys() else "llama.cpp"


def _spec_types(help_text: str, stages: re.Match[str] | None) -> frozenset[str] | None:
    """The ``--spec-type`` values the help lists, in either engine's format (``stages``:
    where the help is in the stage dialect, its types)."""
    if stages:
        names = (t.strip() for t in stages.group(1).split(","))
        return frozenset(_STAGE_TYPES.get(t, t) for t in names if t)
    ik = _IK_SPEC_TYPE.search(help_text)
    if ik:
        return frozenset(t.replace(" ", "") for t in ik.group(1).split("|") if t.strip())
    match = _SPEC_TYPE.search(help_text)
    return frozenset(t for t in re.split(r"[,|]", match.group(1)) if t) if match else None


def parse_capabilities(help_text: str, version_text: str = "") -> Capabilities:
    """Read a build's capabilities from its ``--help`` and ``--version`` output."""
    flags = _flags_with_descriptions(help_text)
    staged = _STAGES.search(help_text)
    stages = staged is not None
    spec_types = _spec_types(help_text, staged)
    new_flags = "--spec-draft-n-max" in flags
    old_flags = "--draft-max" in flags and "removed" not in flags["--draft-max"]
    if spec_types is None:
        # Builds before --spec-type: a draft model (-md) was the only kind, plus lookup decoding.
        spec_types = (
            frozenset({"none", "draft-simple"}) if "--model-draft" in flags else frozenset()
        )
    engine = _engine(flags)
    if engine == "ik_llama.cpp" and "--model-draft" in flags and not stages:
        # ik_llama.cpp lists only the draftless types; a draft model (-md) is one more
        spec_types = spec_types | {"draft-simple"}
    version = _VERSION.search(version_text + "\n" + help_text)
    commit = version.group("commit") if version else None
    return Capabilities(
        engine=engine,
        version=version.group("version") if version else None,
        build=int(version.group("build") or version.group("version"))
        if version and (version.group("build") or version.group("version").isdigit())
        else None,
        commit=commit if commit != "unknown" else None,
        spec_types=spec_types,
        new_spec_flags=new_flags,
        old_draft_flags=old_flags and not stages,
        stages=stages,
        router="--models-preset" in flags,
        metrics="--metrics" in flags,
        autotune="--spec-autotune" in flags,
        flags=frozenset(flags),
    )


def _output(binary: Path, arg: str, timeout_s: float) -> str:
    try:
        result = subprocess.run(
            [str(binary), arg], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"could not run {binary} {arg}: {exc}") from exc
    return result.stdout + result.stderr


def engine_of(binary: Path, timeout_s: float = 60.0) -> EngineName | None:
    """The engine a llama-server binary is, from its help (None when it will not run)."""
    try:
        return _engine(_flags_with_descriptions(_output(binary, "--help", timeout_s)))
    except ProvisionError:
        return None


def probe_capabilities(binary: Path, timeout_s: float = 60.0) -> Capabilities:
    """Run ``binary --version`` and ``--help`` and parse them."""
    version, help_text = (_output(binary, arg, timeout_s) for arg in ("--version", "--help"))
    caps = parse_capabilities(help_text, version)
    if not caps.flags:
        raise ProvisionError(f"{binary} --help printed no flags; is it a llama-server?")
    info = read_build_info(binary)
    if info is not None:  # provisioned: tarball builds print "commit unknown"
        caps = replace(caps, commit=caps.commit or info.commit, patches=frozenset(info.patches))
    return caps
