"""A 100-token tokenizer GGUF for the model writers' tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest


@pytest.fixture
def vocab(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_token_scores([0.0] * 100)
    writer.add_token_types([1] * 100)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
