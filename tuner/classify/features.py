"""Prompt features: content type, entropy, echo potential, and buckets. Pure.

Every scan reads bounded windows of the prompt (the head and tail for text
signals, the last 16 KiB for repetition), so time and memory stay flat however
long the prompt or chat history is; only the byte histogram for entropy reads
the whole prompt, in numpy.

Echo potential is how much of the answer will likely copy the prompt, the
strongest predictor of n-gram drafting's acceptance. It is the larger of an
instruction score (an edit/rewrite/extract/repeat/quote instruction, weighted by
how much of the prompt is code, data or quoted material) and a repetition score
(the share of 8-byte windows in the prompt's tail seen before in it: lists and
repeated structure continue themselves).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tuner.classify.prompt import PromptView

__all__ = ["Features", "byte_entropy", "extract", "repeat_ratio"]

HEAD, TAIL, REPEAT_WINDOW, TAIL_ENTROPY = 4096, 12288, 16384, 512

_LANGUAGES: dict[str, re.Pattern[str]] = {
    "python": re.compile(
        r"^\s*(def \w+\(|class \w+[(:]|import \w+|from [\w.]+ import|elif |return\b|@\w+)|"
        r"\bself\.|\bNone\b|print\(", re.M),
    "javascript": re.compile(
        r"\b(function\s*\w*\(|const \w+ =|let \w+ =|var \w+ =|console\.log|require\(|"
        r"export (default|const|function))|=>|===", re.M),
    "typescript": re.compile(r"\b(interface \w+ \{|: (string|number|boolean)\b|type \w+ =)"),
    "sql": re.compile(
        r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE|FROM|WHERE|JOIN|"
        r"GROUP BY|ORDER BY|LIMIT|COUNT\(\*\))", re.I),
    "go": re.compile(r"\bfunc \w*\(|\bpackage \w+|:=|\bfmt\.\w+|\bgo func\b"),
    "rust": re.compile(r"\bfn \w+|\blet mut\b|\bimpl\b|\bpub fn\b|println!|::new\(|&mut\b"),
    "c": re.compile(r"#include\s*[<\"]|\bint main\s*\(|\bprintf\(|\bmalloc\(|->\w+|\bstd::"),
    "java": re.compile(r"\bpublic (static |final )*(class|void|int|String)\b|System\.out|"
                       r"\bprivate final\b|@Override"),
    "shell": re.compile(r"^\s*(\$ |#!/bin/|sudo |apt(-get)? |echo |export \w+=|cd |ls |grep )",
                        re.M),
    "html": re.compile(r"</?(div|html|span|body|head|p|a|ul|li|table|script)\b[^>]*>"),
}  # fmt: skip
_CODE_LINE = re.compile(r"[;{}]\s*$|^\s{2,}\S|\b(def|function|return|if|for|while)\b.*[:{(]")
_JSON_KEY = re.compile(r'"[^"\n]{1,60}"\s*:')
_YAML_LINE = re.compile(r"^\s*-?\s*[\w.-]{1,30}( [\w.-]{1,20})?:(\s+[^\s.!?][^.!?]{0,60})?$")
# "Question: ...", "Text: ..." are prompt labels, not YAML keys
_LABELS = re.compile(
    r"^\s*(question|answer|text|passage|paragraph|report|story|input|output|context|"
    r"rewritten|converted|reformatted|with type hints|summary|email|article|q|a)\s*:",
    re.I,
)
# "# Python", "// JavaScript", "-- SQL", "```python": the prompt names its language
_LANGUAGE_TAG = re.compile(
    r"^\s*(#|//|--|```)\s*(python|javascript|typescript|js|ts|sql|go|golang|rust|c|c\+\+|cpp|"
    r"java|bash|shell|sh|html|ruby|php|kotlin|swift|csharp|c#)\b",
    re.I | re.M,
)
_CODE_ASK = re.compile(
    r"\b(write|implement|create|generate|code|build|give me)\b[^.?!\n]{0,60}?\b(function|class|"
    r"method|script|program|query|regex|module|struct|trait|algorithm|endpoint|parser|unit tests?|"
    r"quicksort|mergesort|linked list|counter|cli)\b",
    re.I,
)
_SHEBANG = re.compile(r"^#!\S*?(bash|sh|python3?|node|perl|ruby)\b", re.M)
_TAG_NAMES = {"js": "javascript", "ts": "typescript", "golang": "go", "c++": "c", "cpp": "c",
              "bash": "shell", "sh": "shell"}  # fmt: skip
_TABLE_LINE = re.compile(r"^\s*\|.*\|\s*$")
_LOG_LINE = re.compile(
    r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|^(INFO|WARN|WARNING|ERROR|DEBUG|TRACE)\b|"
    r"^\w{3} \d{1,2} \d{2}:\d{2}:\d{2}"
)
_FORMAT_ASK = re.compile(
    r"\b(as|in|into|to|return|output|respond with|produce|emit|generate|create|write|make|"
    r"give me)\s+(valid\s+|a\s+|an\s+)?(json|yaml|csv|xml|markdown table|table)\b",
    re.I,
)
_MATH = re.compile(
    r"\d\s*[-+*/^\u00d7\u00f7=]\s*\d|\\(frac|sqrt|int|sum|cdot)|\$[^$\n]{1,80}\$|"
    r"\b(solve|calculate|compute|equation|integral|derivative|prove|multipl\w+|divided|"
    r"how many|how much|probability|percent|step by step|catch up|average|sum of)\b|"
    r"\d+\s*(km/h|mph|km|kg|%|cm|meters|dollars)",
    re.I,
)
_MATH_STRONG = re.compile(
    r"\b(solve|equation|integral|derivative|probability|prove|theorem|factorial|logarithm|"
    r"matrix|eigen\w*)\b",
    re.I,
)
_QUESTION = re.compile(
    r"^\s*(question:\s*)?(what|why|how|who|when|where|which|can|could|should|is|are|do|does|"
    r"explain|tell me|describe the difference)\b",
    re.I,
)
_PROSE_ASK = re.compile(
    r"\b(story|poem|essay|novel|narrative|describe|imagine|once upon a time|chapter|scene|"
    r"letter to|blog post|lyrics)\b",
    re.I,
)
_ECHO_ASK = re.compile(
    r"\b(rewrite|rename|refactor|reformat|format|convert|fix|correct|edit|modify|sort|"
    r"change|update|replace|add (type hints|types|comments|docstrings|logging|tests)|remove|"
    r"extract|copy|repeat|quote|quoting|keep (everything|the rest|it)|unchanged|identical|"
    r"verbatim|exactly|without changing|"
    r"(from|in|to|of|on) (this|these|the following|the above|the) (report|text|passage|document|"
    r"email|article|paragraph|data|log|code|snippet|function|transcript|table|rows|list|class|"
    r"script|query|file|json|yaml|csv))\b",
    re.I,
)
_MATERIAL_START = re.compile(
    r"^(text|passage|paragraph|report|article|document|input|code|email|transcript|"
    r"context|data)\s*:",
    re.I,
)


@dataclass(frozen=True, slots=True)
class Features:
    content_type: str  # code | data | math | prose | question | other
    subtype: str | None  # a language for code, a format for data
    entropy: float  # bits per byte over the whole prompt
    tail_entropy: float  # bits per byte over its last 512 bytes
    echo: float  # 0..1
    echo_instruction: bool
    material_share: float  # share of the prompt's lines that are code, data or quoted
    repeat_ratio: float
    length_tokens: int  # estimate: bytes / 4
    length_bucket: str  # short | medium | long
    temperature: float | None
    sampling: str  # greedy | sampled
    max_tokens: int | None
    chat: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def byte_entropy(data: bytes) -> float:
    """Shannon entropy in bits per byte.

    >>> byte_entropy(b""), byte_entropy(b"aaaa"), byte_entropy(bytes(range(256)))
    (0.0, 0.0, 8.0)
    """
    if not data:
        return 0.0
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    p = counts[counts > 0] / len(data)
    return float(abs(-(p * np.log2(p)).sum()))


def repeat_ratio(data: bytes, width: int = 8) -> float:
    """Share of the ``width``-byte windows that occurred earlier (or later) in ``data``.

    >>> repeat_ratio(b"abcdefgh" * 8) > 0.8, repeat_ratio(bytes(range(200)))
    (True, 0.0)
    """
    n = len(data) - width + 1
    if n <= 1:
        return 0.0
    raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(width):  # an exact 64-bit packing of 8 bytes: no collisions
        h = (h << np.uint64(8)) | raw[j : j + n]
    _, counts = np.unique(h, return_counts=True)
    return float(counts[counts > 1].sum() / n)


def _window(text: str) -> str:
    if len(text) <= HEAD + TAIL:
        return text
    return text[:HEAD] + "\n" + text[-TAIL:]


def _csv_lines(lines: list[str]) -> int:
    """Lines in runs of 3 or more short lines with the same number (>= 1) of commas."""
    total, run, commas = 0, 0, -1
    for line in [*lines, ""]:
        count = line.count(",") if len(line) < 200 and ". " not in line else 0
        if count and count == commas:
            run += 1
        else:
            total += run if run >= 3 else 0
            run, commas = (1, count) if count else (0, -1)
    return total


def _data_format(lines: list[str], window: str) -> tuple[str | None, int]:
    """The dominant structured format and how many lines it covers."""
    scores = {
        "json": len(_JSON_KEY.findall(window)),
        "table": sum(1 for line in lines if _TABLE_LINE.match(line)),
        "log": sum(1 for line in lines if _LOG_LINE.match(line)),
        "csv": _csv_lines(lines),
        "yaml": sum(1 for line in lines if _YAML_LINE.match(line) and not _LABELS.match(line)),
    }
    if scores["yaml"] < 3:
        scores["yaml"] = 0
    name = max(scores, key=lambda k: scores[k])
    return (name, scores[name]) if scores[name] >= 2 else (None, 0)


def _code_language(window: str, lines: list[str]) -> tuple[str | None, int]:
    tag = _LANGUAGE_TAG.search(window)
    if tag:
        name = tag.group(2).lower()
        return _TAG_NAMES.get(name, name), 3
    shebang = _SHEBANG.search(window)
    if shebang:
        name = shebang.group(1).lower().rstrip("3")
        return {"sh": "shell", "bash": "shell", "node": "javascript"}.get(name, name), 3
    hits = {name: len(pattern.findall(window)) for name, pattern in _LANGUAGES.items()}
    if hits["typescript"] and hits["javascript"]:
        hits["typescript"] += hits["javascript"]
    name = max(hits, key=lambda k: hits[k])
    code_lines = sum(1 for line in lines if _CODE_LINE.search(line))
    strength = hits[name] + code_lines // 2
    if name == "sql" and len({m.upper() for m in _LANGUAGES["sql"].findall(window)}) < 3:
        return None, 0  # "select ... from" in prose is not a query
    return (name, strength) if hits[name] >= 2 or (hits[name] and code_lines >= 2) else (None, 0)


def _looks_like_code(line: str, language: str) -> bool:
    pattern = _LANGUAGES.get(language)
    return bool(
        _CODE_LINE.search(line)
        or line.startswith(("    ", "\t"))
        or (pattern is not None and pattern.search(line))
    )


def _material_lines(lines: list[str], code: str | None, data: str | None) -> int:
    """Lines inside fences, quoted passages, or that look like code or data."""
    count, fenced, quoted = 0, False, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if not stripped:
            quoted = False
            continue
        if _MATERIAL_START.match(stripped):
            quoted = True
        looks = (
            fenced
            or quoted
            or stripped.startswith(">")
            or (code is not None and _looks_like_code(line, code))
            or (data is not None and bool(_YAML_LINE.match(line) or "," in line
                                          or _TABLE_LINE.match(line) or _LOG_LINE.match(line)))
        )  # fmt: skip
        count += looks
    return count


def _content_type(
    view: PromptView, window: str, lines: list[str]
) -> tuple[str, str | None, int, int]:
    if view.chat:  # what is asked now, not tool output or history, sets the type
        window = _window(view.instruction)
        lines = window.splitlines()
    code, code_strength = _code_language(window, lines)
    data, data_lines = _data_format(lines, window)
    asked = _FORMAT_ASK.search(view.instruction[:HEAD])
    n = max(len(lines), 1)
    if data and data_lines / n >= 0.3 and data_lines >= code_strength:
        return "data", data, code_strength, data_lines
    if code and code_strength >= 2:
        return "code", code, code_strength, data_lines
    if asked:
        fmt = asked.group(3).lower()
        return "data", "table" if "table" in fmt else fmt, code_strength, data_lines
    if _CODE_ASK.search(view.instruction[:HEAD]):
        return "code", code, code_strength, data_lines
    if data and data_lines >= 3:
        return "data", data, code_strength, data_lines
    instruction = view.instruction.strip()
    math_hits = len(_MATH.findall(window))
    digits = sum(c.isdigit() for c in window[:HEAD]) / max(len(window[:HEAD]), 1)
    math_hits += len(_MATH_STRONG.findall(window))
    if math_hits >= 2 or (math_hits and digits > 0.05) or digits > 0.3:
        return "math", None, code_strength, data_lines
    if _PROSE_ASK.search(instruction[:HEAD]):
        return "prose", None, code_strength, data_lines
    if (
        instruction.endswith("?")
        or "?\n" in instruction[-400:]
        or (_QUESTION.match(instruction) and len(instruction) < 600)
    ):
        return "question", None, code_strength, data_lines
    letters = sum(c.isalpha() or c.isspace() for c in window) / max(len(window), 1)
    if letters > 0.85 and len(window) >= 40:
        return "prose", None, code_strength, data_lines
    return ("question" if view.chat else "other"), None, code_strength, data_lines


def extract(view: PromptView, body: dict[str, Any] | None = None) -> Features:
    """All features of one prompt; ``body`` supplies the sampling parameters."""
    body = body or {}
    window = _window(view.text)
    lines = window.splitlines()
    content, subtype, _, _ = _content_type(view, window, lines)
    code = subtype if content == "code" else None
    data = subtype if content == "data" else None
    material = _material_lines(lines, code, data) / max(len(lines), 1)
    encoded = view.text.encode("utf-8", errors="replace")
    repeat = repeat_ratio(encoded[-REPEAT_WINDOW:])
    instructed = bool(_ECHO_ASK.search(view.instruction[:HEAD]))
    instruction_score = (0.55 if instructed else 0.0) + 0.45 * min(1.0, 1.5 * material)
    echo = max(instruction_score if instructed else 0.5 * instruction_score, min(1.0, 2.5 * repeat))
    tokens = len(encoded) // 4
    temperature = body.get("temperature")
    temp = float(temperature) if isinstance(temperature, int | float) else None
    greedy = (temp is not None and temp <= 0.01) or body.get("top_k") == 1
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict")))
    return Features(
        content_type=content,
        subtype=subtype,
        entropy=round(byte_entropy(encoded), 4),
        tail_entropy=round(byte_entropy(encoded[-TAIL_ENTROPY:]), 4),
        echo=round(echo, 4),
        echo_instruction=instructed,
        material_share=round(material, 4),
        repeat_ratio=round(repeat, 4),
        length_tokens=tokens,
        length_bucket="short" if tokens < 256 else "medium" if tokens < 2048 else "long",
        temperature=temp,
        sampling="greedy" if greedy else "sampled",
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        chat=view.chat,
    )
