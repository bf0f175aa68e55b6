"""Byte statistics of a prompt: entropy and repetition. Pure.

Both read bytes, not words: entropy in bits per byte from the byte histogram; repetition as
the share of ``width``-byte windows already seen earlier in the text (lists and repeated
structure continue themselves). Short inputs take a plain-Python path, since numpy's fixed
cost per call dominates them.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

__all__ = ["byte_entropy", "repeat_ratio"]

_SMALL = 256  # bytes: below this, plain Python beats numpy's per-call overhead
# c * log2(c) for every count a byte value can have in a prompt of up to 64 KiB (512 KiB):
# entropy = log2(n) - sum(c log2 c) / n, one table lookup instead of four array operations.
_TABLE = 1 << 16
_XLOG2X = np.concatenate(([0.0], np.arange(1, _TABLE) * np.log2(np.arange(1, _TABLE))))


_SMALL = 256  # bytes: below this, plain Python beats numpy's per-call overhead
# c * log2(c) for every count a byte value can have in a prompt of up to 64 KiB (512 KiB):
# entropy = log2(n) - sum(c log2 c) / n, one table lookup instead of four array operations.
_TABLE = 1 << 16
_XLOG2X = np.concatenate(([0.0], np.arange(1, _TABLE) * np.log2(np.arange(1, _TABLE))))


def byte_entropy(data: bytes) -> float:
    """Shannon entropy in bits per byte.

    >>> byte_entropy(b""), byte_entropy(b"aaaa"), byte_entropy(bytes(range(256)))
    (0.0, 0.0, 8.0)
    """
    if not data:
        return 0.0
    return _entropy_small(data) if len(data) < _SMALL else _entropy_numpy(data)


def _entropy_small(data: bytes) -> float:  # numpy's fixed cost dominates short inputs
    total = len(data)
    return abs(-sum(c / total * math.log2(c / total) for c in Counter(data).values()))


def _entropy_numpy(data: bytes) -> float:
    n = len(data)
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    if n < _TABLE:
        return max(0.0, math.log2(n) - float(_XLOG2X[counts].sum()) / n)
    p = counts[counts > 0] / n
    return float(abs(-(p * np.log2(p)).sum()))


def repeat_ratio(data: bytes, width: int = 8) -> float:
    """Share of the ``width``-byte windows that occurred earlier (or later) in ``data``.

    >>> repeat_ratio(b"abcdefgh" * 8) > 0.8, repeat_ratio(bytes(range(200)))
    (True, 0.0)
    """
    n = len(data) - width + 1
    if n <= 1:
        return 0.0
    return _repeat_small(data, width, n) if len(data) < _SMALL else _repeat_numpy(data, width, n)


def _repeat_small(data: bytes, width: int, n: int) -> float:
    windows = Counter(data[i : i + width] for i in range(n))
    return sum(c for c in windows.values() if c > 1) / n


def _repeat_numpy(data: bytes, width: int, n: int) -> float:
    if width == 8:  # each window read as one 64-bit integer (overlapping strides): exact
        h = np.ndarray((n,), dtype="<u8", buffer=data, strides=(1,)).copy()
    else:
        raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
        h = np.zeros(n, dtype=np.uint64)
        for j in range(width):  # an exact packing of up to 8 bytes: no collisions
            h = (h << np.uint64(8)) | raw[j : j + n]
    h.sort()
    same = h[1:] == h[:-1]
    # every window equal to a neighbour in sorted order occurs at least twice: window i
    # (0 < i < n-1) repeats if same[i-1] or same[i]; the first and last have one neighbour
    inner = np.count_nonzero(same[1:] | same[:-1])
    return (inner + int(same[0]) + int(same[-1])) / n
