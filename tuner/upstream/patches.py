"""Small fixes the build applies to a pinned engine's sources before compiling them.

A patch is a few exact text replacements in the vendored tree, each applied only where its
text is found exactly once: a source that changed under a patch fails the build loudly
instead of building something no one checked. The patches' text is part of the build's
cache key (editing one rebuilds the engine) and their names are recorded beside the binary
(``build_info``), so what a build answers can be read from it (``Capabilities.patches``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ProvisionError

__all__ = ["COUNT_EMITTED", "RELEASE_REFUSED", "Edit", "Patch", "apply_patches", "patches_tag"]


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace ``old`` with ``new`` in ``path`` (relative to the engine's tree)."""

    path: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class Patch:
    """One fix, named as the build's record and its capabilities name it."""

    name: str
    edits: tuple[Edit, ...]


_SERVER = "examples/server/server-context.cpp"

# ik_llama.cpp (55d3c05 and its head, 8337e4cd3) adds a verify round's tokens to n_decoded
# before it emits them one by one, so when that round reaches max_tokens the budget check
# stops at the round's first token: the answer leaves out the round's accepted drafts while
# its usage counts them. Counting each token as it is emitted, as its path without
# speculation does, gives the answer mainline gives.
COUNT_EMITTED = Patch(
    name="count-emitted-tokens",
    edits=(
        Edit(
            path=_SERVER,
            old="        slot.n_past += ids.size();\n        slot.n_decoded += ids.size();\n",
            new="        slot.n_past += ids.size();\n",
        ),
        Edit(
            path=_SERVER,
            old=(
                "        for (size_t i = 0; i < ids.size(); ++i) {\n"
                "            completion_token_output result;\n"
                "\n"
            ),
            new=(
                "        for (size_t i = 0; i < ids.size(); ++i) {\n"
                "            completion_token_output result;\n"
                "            slot.n_decoded += 1;\n"
                "\n"
            ),
        ),
    ),
)


# ik_llama.cpp (55d3c05 and 8337e4cd3) refuses a prompt longer than the context, then
# releases a slot that is not yet processing, which does nothing: the slot goes on loading
# the refused prompt until its cache is full (minutes of every core at a 32k context).
# Marking it processing first, as the empty-prompt branch above it does, frees it at once.
_INDENT = " " * 32
_REFUSED = (
    _INDENT + 'send_error(slot, "the request exceeds the available context size, try increasing'
    ' it", ERROR_TYPE_SERVER);\n'
)
RELEASE_REFUSED = Patch(
    name="release-refused-prompt",
    edits=(
        Edit(
            path=_SERVER,
            old=_REFUSED + _INDENT + "slot.release();\n",
            new=(
                _REFUSED
                + _INDENT
                + "slot.state = SLOT_STATE_PROCESSING;\n"
                + _INDENT
                + "slot.command = SLOT_COMMAND_NONE;\n"
                + _INDENT
                + "slot.release();\n"
            ),
        ),
    ),
)


def apply_patches(tree: Path, patches: tuple[Patch, ...]) -> None:
    """Apply each patch's edits to the tree, or raise ``ProvisionError`` naming the patch
    whose text is not found exactly once."""
    for patch in patches:
        for edit in patch.edits:
            file = tree / edit.path
            text = file.read_text()
            found = text.count(edit.old)
            if found != 1:
                raise ProvisionError(
                    f"patch {patch.name}: its text is found {found} times in {edit.path} "
                    "(once expected): the pinned source is not the one it was written for"
                )
            file.write_text(text.replace(edit.old, edit.new))


def patches_tag(patches: tuple[Patch, ...]) -> str:
    """A short name for a set of patches, for the build's cache key ("" for none).

    >>> patches_tag(())
    ''
    >>> len(patches_tag((COUNT_EMITTED,)))
    8
    """
    if not patches:
        return ""
    digest = hashlib.sha256()
    for patch in patches:
        for edit in patch.edits:
            digest.update("\0".join((edit.path, edit.old, edit.new)).encode())
    return "p" + digest.hexdigest()[:7]
