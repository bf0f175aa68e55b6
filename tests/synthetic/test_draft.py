"""A draft cut from the target's file (llama-server runs one from Gemma in tests/integration)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.cli.main import main
from tuner.model.gguf_facts import draft_compatibility, read_facts
from tuner.synthetic.draft import derive_draft, parse_layers
from tuner.synthetic.moe import SynthSpec, write_moe

SPEC = SynthSpec(
    experts=4, active=2, layers=4, hidden=64, expert_ffn=32, heads=2, kv_heads=1, head_dim=32
)


@pytest.fixture
def target(vocab: Path, tmp_path: Path) -> Path:
    return write_moe(tmp_path / "target.gguf", vocab, SPEC)


def _tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[int, set[int]]:
    total = draw(st.integers(1, 40))
    return total, draw(st.sets(st.integers(0, total - 1), min_size=1))


@given(_blocks())
def test_a_written_list_of_blocks_parses_back(case: tuple[int, set[int]]) -> None:
    total, keep = case
    assert parse_layers(",".join(map(str, sorted(keep))), total) == tuple(sorted(keep))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("3,1", "ascending"),
        ("1,1", "ascending"),
        ("0-4", "blocks 0-3"),
        ("a", "not N"),
        ("", "not N"),
        ("2-", "not N"),
        ("3-1", "ascending"),
    ],
)
def test_bad_block_lists_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_layers(text, 4)


def test_ranges_expand() -> None:
    assert parse_layers("0-2,5", 6) == (0, 1, 2, 5)


def test_the_kept_blocks_are_renumbered_with_their_weights(target: Path, tmp_path: Path) -> None:
    draft = derive_draft(target, tmp_path / "draft.gguf", [1, 3])
    facts = read_facts(draft.path)
    assert facts.n_layers == 2 and draft.layers == (1, 3) and draft.source_layers == 4
    source, cut = _tensors(target), _tensors(draft.path)
    assert not any(name.startswith("blk.2.") for name in cut)
    for old, new in ((1, 0), (3, 1)):
        for name, tensor in source.items():
            if name.startswith(f"blk.{old}."):
                twin = cut[name.replace(f"blk.{old}.", f"blk.{new}.", 1)]
                assert np.array_equal(np.asarray(twin.data), np.asarray(tensor.data))
    assert draft.bytes < draft.source_bytes
    # the pairing llama.cpp checks before it runs draft-simple: same tokenizer, same tokens
    assert draft_compatibility(read_facts(target), facts).compatible


def test_the_embedding_can_be_stored_cheaper(target: Path, tmp_path: Path) -> None:
    draft = derive_draft(target, tmp_path / "q.gguf", [0], embedding="q8_0")
    source = _tensors(target)["token_embd.weight"]
    cut = _tensors(draft.path)["token_embd.weight"]
    assert cut.tensor_type == gguf.GGMLQuantizationType.Q8_0 != source.tensor_type
    dense = gguf.quants.dequantize(np.asarray(source.data), source.tensor_type)
    back = gguf.quants.dequantize(np.asarray(cut.data), cut.tensor_type)
    assert back.shape == dense.shape
    assert np.abs(back - dense).max() <= np.abs(dense).max() / 100  # 8-bit blocks


def test_the_command_writes_a_draft_and_refuses_missing_blocks(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.gguf"
    assert main(["derive-draft", str(out), "--model", str(target), "--layers", "0,3"]) == 0
    assert "2 of 4 blocks (0,3)" in capsys.readouterr().out
    assert read_facts(out).n_layers == 2
    assert main(["derive-draft", str(out), "--model", str(target), "--layers", "0-7"]) == 2
    assert "blocks 0-3" in capsys.readouterr().err


def test_the_command_names_a_model_without_blocks_and_an_out_it_cannot_write(
    vocab: Path, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["derive-draft", str(tmp_path / "d.gguf"), "--model", str(vocab), "--layers", "0"])
        == 2
    )
    assert "no blocks to keep (a vocabulary-only GGUF?)" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the command needs a folder
    for out in (blocked / "d.gguf", tmp_path / "dir"):
        (tmp_path / "dir").mkdir(exist_ok=True)  # the second: a folder where a file goes
        assert main(["derive-draft", str(out), "--model", str(target), "--layers", "0"]) == 2
        err = capsys.readouterr().err
        assert f"cannot write {out}" in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dir",
        "file",
        "target.gguf",
        "vocab.gguf",
    ]


def test_a_wider_model_keeps_its_per_layer_lists_aligned(vocab: Path, tmp_path: Path) -> None:
    """Per-layer hyperparameter arrays (some architectures have them) follow their blocks."""
    path = write_moe(tmp_path / "t.gguf", vocab, replace(SPEC, layers=3))
    reader = gguf.GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())
    listed = tmp_path / "listed.gguf"
    writer = gguf.GGUFWriter(listed, arch)
    for field in reader.fields.values():
        if field.name != "general.architecture" and not field.name.startswith("GGUF."):
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_array(f"{arch}.attention.head_count_kv_list", [10, 11, 12])
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    draft = derive_draft(listed, tmp_path / "cut.gguf", [0, 2])
    field = gguf.GGUFReader(draft.path).fields[f"{arch}.attention.head_count_kv_list"]
    assert field.contents() == [10, 12]
