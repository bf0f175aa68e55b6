"""The SSE sniffer finds the last timings however the stream is cut into chunks."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from tuner.proxy.sse import ModelRename, TimingsSniffer


def _pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    """The stream cut at ``cuts`` (any order, repeats allowed)."""
    points = sorted(set(cuts))
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


STREAM = (
    b": ping\n\n"
    b'data: {"choices":[{"text":"a"}]}\n\n'
    b'data: {"choices":[],"timings":{"predicted_n":9,"draft_n":4}}\n\n'
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_timings_found_for_any_chunking(cuts: list[int]) -> None:
    sniffer = TimingsSniffer()
    for piece in _pieces(STREAM, cuts):
        sniffer.feed(piece)
    sniffer.close()
    assert sniffer.timings == {"predicted_n": 9, "draft_n": 4}
    assert sniffer.events == 3
    assert sniffer.error is None
    assert sniffer.done


def test_the_end_of_the_stream_is_noticed_only_at_done() -> None:
    sniffer = TimingsSniffer()
    sniffer.feed(STREAM[: STREAM.index(b"data: [DONE]")])
    assert not sniffer.done
    sniffer.feed(b'data: {"choices":[{"text":"[DONE]"}]}\n\n')  # not the end: a text
    assert not sniffer.done
    sniffer.feed(b"data: [DONE]\n\n")
    assert sniffer.done


def test_error_event_is_noticed() -> None:
    sniffer = TimingsSniffer()
    sniffer.feed(b"data: " + json.dumps({"error": {"message": "gone"}}).encode())
    sniffer.close()
    assert sniffer.error == "gone"


@given(st.binary(max_size=300))
def test_garbage_never_raises(data: bytes) -> None:
    sniffer = TimingsSniffer()
    sniffer.feed(data)
    sniffer.close()


PRESET_STREAM = (
    b'data: {"model":"ngram-mod.match24.max16","choices":[{"text":"\\"model\\":\\"x\\""}]}\n\n'
    b'data: {"choices": [], "model": "ngram-mod.match24.max16"}\n\n'
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(PRESET_STREAM)), max_size=12))
def test_the_preset_is_renamed_however_the_stream_is_cut(cuts: list[int]) -> None:
    rename = ModelRename("ngram-mod.match24.max16", "gemma")
    out = b"".join(rename.feed(piece) for piece in _pieces(PRESET_STREAM, cuts)) + rename.flush()
    assert out == rename.whole(PRESET_STREAM)
    assert out.count(b'"model":"gemma"') == out.count(b'"model": "gemma"') == 1
    assert b"ngram-mod" not in out
    assert b'\\"model\\":\\"x\\"' in out  # answer text is left alone


def test_a_chunk_that_cannot_begin_the_pattern_passes_at_once() -> None:
    rename = ModelRename("p", "gemma")
    assert rename.feed(b'data: {"x":1}\n\n') == b'data: {"x":1}\n\n'
    assert rename.feed(b'data: {"mod') == b"data: {"  # '"mod' may begin the pattern
    assert rename.feed(b'el":"p"}') == b'"model":"gemma"}'
    assert rename.flush() == b""
