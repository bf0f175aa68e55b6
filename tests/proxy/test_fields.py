"""The field table: documented as it is, its bad values refused, its treatments applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import RequestError
from tuner.proxy.fields import CHAT, COMPLETIONS, FIELDS, NATIVE, normalize, table_markdown
from tuner.proxy.validation import validate

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"prompt": "hi"},
    NATIVE: {"prompt": "hi"},
}


def test_the_operations_doc_shows_the_table_as_it_is() -> None:
    assert table_markdown() in (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.parametrize("field", [f for f in FIELDS if f.bad is not None], ids=lambda f: f.name)
def test_each_bad_value_is_refused_naming_its_field(field: object) -> None:
    name, bad = field.name, field.bad  # type: ignore[attr-defined]
    path = (
        COMPLETIONS
        if name == "prompt"
        else next(
            p
            for p in (CHAT, COMPLETIONS, NATIVE)
            if p in field.endpoints  # type: ignore[attr-defined]
        )
    )
    with pytest.raises(RequestError) as refused:
        validate(path, {**BASE[path], name: bad})
    assert refused.value.param == name


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_each_sample_value_passes_validation(field: object) -> None:
    for path in field.endpoints:  # type: ignore[attr-defined]
        validate(path, {**BASE[path], field.name: field.sample})  # type: ignore[attr-defined]


def test_a_length_is_sent_as_both_engines_read_it_and_a_set_one_wins() -> None:
    body = {"messages": [], "max_completion_tokens": 4}
    assert normalize(CHAT, body) and body["max_tokens"] == 4
    kept = {"messages": [], "max_completion_tokens": 4, "max_tokens": 9}
    assert not normalize(CHAT, kept) and kept["max_tokens"] == 9
    native = {"prompt": "x", "max_completion_tokens": 4}
    assert not normalize(NATIVE, native) and "max_tokens" not in native


def test_an_infill_without_a_prompt_gets_mainlines_empty_one() -> None:
    body = {"input_prefix": "def f(", "input_suffix": ")"}
    assert normalize("/infill", body) and body["prompt"] == ""
    given = {"input_prefix": "a", "prompt": "b"}
    assert not normalize("/infill", given) and given["prompt"] == "b"
