"""A same-vocabulary draft cut from the target's own file.

Only one real model is at hand offline (Gemma 3 270M), and ``draft-simple`` needs a draft
that shares the target's vocabulary. Keeping some of the target's blocks (renumbered, in
order) with its embedding and output norm gives such a draft with real, if weak, acceptance:
a layer-skipping self-draft. Its cost is what it keeps; on a small-vocabulary-heavy model the
tied embedding (the output head) is most of a step, so it may be stored at a cheaper type.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

__all__ = ["DerivedDraft", "derive_draft", "parse_layers"]

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_SPAN = re.compile(r"^(\d+)(?:-(\d+))?$")
EMBEDDING = "token_embd.weight"
EMBEDDING_TYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}


@dataclass(frozen=True, slots=True)
class DerivedDraft:
    path: Path
    layers: tuple[int, ...]  # the target's block indices kept, in order
    source_layers: int
    bytes: int  # tensor bytes of the draft
    source_bytes: int


def parse_layers(text: str, total: int) -> tuple[int, ...]:
    """``"0-3,16,17"`` -> (0, 1, 2, 3, 16, 17); indices must exist, ascend and not repeat."""
    out: list[int] = []
    for part in text.split(","):
        m = _SPAN.match(part.strip())
        if m is None:
            raise ValueError(f"layers: {part!r} is not N or N-M")
        out.extend(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return _checked(out, total, text)


def _checked(blocks: Sequence[int], total: int, shown: str) -> tuple[int, ...]:
    if total <= 0:
        raise ValueError("the model has no blocks to keep (a vocabulary-only GGUF?)")
    if not blocks or any(b <= a for a, b in itertools.pairwise(blocks)):
        raise ValueError(f"layers {shown!r}: want ascending block indices without repeats")
    if blocks[0] < 0 or blocks[-1] >= total:
        raise ValueError(f"layers {shown!r}: the model has blocks 0-{total - 1}")
    return tuple(blocks)


def _field_value(reader: GGUFReader, name: str) -> object:
    return reader.fields[name].contents()


def derive_draft(
    source: Path, out: Path, layers: Sequence[int], embedding: str | None = None
) -> DerivedDraft:
    """Write ``source`` with only ``layers`` kept to ``out`` (atomically); ``embedding``
    (``q4_0``/``q8_0``) re-stores the token embedding at that type."""
    reader = GGUFReader(source)
    arch = str(_field_value(reader, "general.architecture"))
    total = int(str(_field_value(reader, f"{arch}.block_count")))
    keep = _checked(list(layers), total, ",".join(map(str, layers)))
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _write(reader, arch, total, keep, tmp, out, embedding)
    finally:
        tmp.unlink(missing_ok=True)  # a write that failed leaves no part-written file


def _write(
    reader: GGUFReader,
    arch: str,
    total: int,
    keep: tuple[int, ...],
    tmp: Path,
    out: Path,
    embedding: str | None,
) -> DerivedDraft:
    renumber = {old: new for new, old in enumerate(keep)}
    writer = GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = len(keep)
        elif isinstance(value, list) and len(value) == total and field.name.startswith(arch):
            value = [value[i] for i in keep]  # per-layer hyperparameters follow their blocks
        elif field.name == "general.name":
            value = f"{value} (blocks {','.join(map(str, keep))})"
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    tensors: list[tuple[str, np.ndarray, GGMLQuantizationType]] = []
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) not in renumber:
            continue
        name = f"blk.{renumber[int(m.group(1))]}.{m.group(2)}" if m else t.name
        data, qtype = np.asarray(t.data), t.tensor_type
        if name == EMBEDDING and embedding is not None and EMBEDDING_TYPES[embedding] != qtype:
            qtype = EMBEDDING_TYPES[embedding]
            data = quants.quantize(quants.dequantize(data, t.tensor_type).astype(np.float32), qtype)
        tensors.append((name, data, qtype))
    for name, data, qtype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    tmp.replace(out)
    kept = sum(d.nbytes for _, d, _ in tensors)
    return DerivedDraft(out, keep, total, kept, sum(t.n_bytes for t in reader.tensors))
