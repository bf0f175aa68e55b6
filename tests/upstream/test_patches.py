"""The build's source patches: applied where their text is found once, refused otherwise."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tuner.errors import ProvisionError
from tuner.settings import Settings
from tuner.upstream.patches import COUNT_EMITTED, Edit, Patch, apply_patches, patches_tag
from tuner.upstream.sources import IK_LLAMA_CPP

PATCH = Patch(name="p", edits=(Edit(path="src/a.cpp", old="n += k;\n", new=""),))


def _tree(tmp_path: Path, text: str) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.cpp").write_text(text)
    return tmp_path


def test_a_patch_replaces_its_text(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "int n;\nn += k;\nreturn n;\n")
    apply_patches(tree, (PATCH,))
    assert (tree / "src" / "a.cpp").read_text() == "int n;\nreturn n;\n"


@pytest.mark.parametrize("text", ["int n;\n", "n += k;\nn += k;\n"])
def test_a_patch_whose_text_is_not_found_once_fails_the_build(tmp_path: Path, text: str) -> None:
    tree = _tree(tmp_path, text)
    with pytest.raises(ProvisionError, match=r"patch p: .* found [02] times"):
        apply_patches(tree, (PATCH,))
    assert (tree / "src" / "a.cpp").read_text() == text


def test_the_tag_changes_with_a_patchs_text() -> None:
    edited = Patch(name="p", edits=(Edit(path="src/a.cpp", old="n += k;\n", new="n += 1;\n"),))
    assert patches_tag((PATCH,)) != patches_tag((edited,))
    assert patches_tag(()) == ""


@pytest.mark.llama
def test_the_ik_patches_apply_to_the_pinned_source(tmp_path: Path) -> None:
    """The pinned ik_llama.cpp sdist (downloaded by its build) takes every patch once."""
    sdist = Settings().cache_dir / "downloads" / IK_LLAMA_CPP.archive
    if not sdist.is_file():
        pytest.skip(f"{sdist} is downloaded by `tuner provision --engine ik_llama.cpp`")
    prefix = f"{IK_LLAMA_CPP.archive.removesuffix('.tar.gz')}/{IK_LLAMA_CPP.vendor}/"
    with tarfile.open(sdist) as archive:
        wanted = {prefix + edit.path for patch in IK_LLAMA_CPP.patches for edit in patch.edits}
        members = [m for m in archive.getmembers() if m.name in wanted]
        archive.extractall(tmp_path, members=members, filter="data")
    tree = tmp_path / prefix
    apply_patches(tree, IK_LLAMA_CPP.patches)
    text = (tree / COUNT_EMITTED.edits[0].path).read_text()
    assert "slot.n_decoded += ids.size();" not in text
    assert text.count("slot.n_decoded += 1;") == 2  # the plain path's, and the round's
    refused = text.split("the request exceeds the available context size", 1)[1]
    assert refused.index("slot.state = SLOT_STATE_PROCESSING;") < refused.index("slot.release();")
