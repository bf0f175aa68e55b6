"""Prompt features: content type, entropy, echo potential, and buckets. Pure.

Speed is part of the contract (issue: p99 <= 0.5 ms at 8 KB, <= 5 ms at 128 KB), so
the text signals come from one pass that lower-cases a bounded window (the first
256 bytes and last 1 KiB of the prompt, and the instruction's first 768), counts
its words once, and counts a few substring markers; no regular expression with
long alternations runs over the text. Repetition looks at the last 1 KiB; only
the byte histogram for entropy reads the whole (bounded) prompt, in numpy. Time
and memory stay flat however long the prompt or chat history is.

Echo potential is how much of the answer will likely copy the prompt, the
strongest predictor of n-gram drafting's acceptance. It is the larger of an
instruction score (an edit/rewrite/extract/repeat/quote instruction, weighted by
how much of the prompt is code, data or quoted material) and a repetition score
(the share of 8-byte windows in the prompt's tail seen before in it: lists and
repeated structure continue themselves).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.classify.prompt import PromptView

__all__ = ["Features", "byte_entropy", "extract", "repeat_ratio"]

HEAD, TAIL, REPEAT_WINDOW, TAIL_ENTROPY, INSTRUCTION = 256, 1024, 1024, 512, 768

_WORD = re.compile(r"[a-z_][a-z0-9_]*")
_SMALL = 256  # bytes: below this, plain Python beats numpy's per-call overhead

# language -> (keyword weights, substring markers counted in the lower-cased window)
_LANGUAGES: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    "python": ({"def": 2, "elif": 3, "self": 2, "none": 1, "lambda": 2, "__init__": 3,
                "isinstance": 3, "kwargs": 3},
               ("):\n", "import ", "print(", "self.", "return ")),
    "javascript": ({"const": 2, "let": 1, "var": 1, "function": 2, "console": 2, "undefined": 2,
                    "require": 2},
                   ("=>", "===", "console.log", "});", "export default")),
    "typescript": ({"interface": 2}, (": string", ": number", ": boolean")),
    "go": ({"func": 3, "fmt": 3, "chan": 2, "defer": 3, "goroutine": 3},
           (":=", "go func", "err != nil", "package main")),
    "rust": ({"fn": 3, "impl": 3, "mut": 2, "usize": 3, "trait": 2},
             ("println!", "::new(", "&mut", "pub fn")),
    "c": ({"printf": 3, "malloc": 3, "sizeof": 3, "std": 1},
          ("#include", "->", "std::", "int main(")),
    "java": ({"extends": 2, "implements": 2, "override": 2},
             ("system.out", "@override", "public class", "public static void", "private final")),
    "shell": ({"sudo": 3, "grep": 2, "esac": 3, "apt": 2, "mkdir": 2},
              ("#!/bin", "\n$ ", "&& ", "\nexport ", "\ncd ", "\necho ")),
    "html": ({"div": 2, "span": 2, "href": 3, "li": 1, "ul": 1}, ("</", "/>")),
}  # fmt: skip
# word -> ((language, weight), ...): language keywords indexed once
_WORD_INDEX: dict[str, tuple[tuple[str, int], ...]] = {}
for _name, (_weights, _) in _LANGUAGES.items():
    for _word, _weight in _weights.items():
        _WORD_INDEX[_word] = (*_WORD_INDEX.get(_word, ()), (_name, _weight))
_SQL_OPENERS = (("select", "from"), ("insert", "into"), ("create", "table"), ("delete", "from"),
                ("update", "set"))  # fmt: skip
_SQL_WORDS = frozenset({"select", "from", "where", "join", "group", "order", "limit",
                        "insert", "into", "update", "delete", "create", "table", "count",
                        "having"})  # fmt: skip
_YAML_LINE = re.compile(r"^\s*-?\s*[\w.-]{1,30}( [\w.-]{1,20})?:(\s+[^\s.!?][^.!?]{0,60})?$")
_LOG_LINE = re.compile(
    r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|^(INFO|WARN|WARNING|ERROR|DEBUG|TRACE)\b|"
    r"^\w{3} \d{1,2} \d{2}:\d{2}:\d{2}"
)
_JSON_KEY = re.compile(r'"[^"\n]{1,60}"\s*:')
# "Question: ...", "Text: ..." are prompt labels, not YAML keys
_LABELS = re.compile(
    r"^\s*(question|answer|text|passage|paragraph|report|story|input|output|context|"
    r"rewritten|converted|reformatted|with type hints|summary|email|article|q|a)\s*:",
    re.I,
)
_MATERIAL_START = re.compile(
    r"^(text|passage|paragraph|report|article|document|input|code|email|transcript|"
    r"context|data)\s*:",
    re.I,
)
# "# Python", "// JavaScript", "-- SQL", "```python": the prompt names its language
_LANGUAGE_TAG = re.compile(
    r"^\s*(#|//|--|```)\s*(python|javascript|typescript|js|ts|sql|go|golang|rust|c|c\+\+|cpp|"
    r"java|bash|shell|sh|html|ruby|php|kotlin|swift|csharp|c#)\b",
    re.I | re.M,
)
_TAG_MARKS = ("#", "//", "--", "```")  # a tag needs one of these: skip the regex otherwise
_SHEBANG = re.compile(r"^#!\S*?(bash|sh|python3?|node|perl|ruby)\b", re.M)
_TAG_NAMES = {"js": "javascript", "ts": "typescript", "golang": "go", "c++": "c", "cpp": "c",
              "bash": "shell", "sh": "shell"}  # fmt: skip
_DIGIT = re.compile(r"\d")
_NOT_LETTER = re.compile(r"[^a-zA-Z\s]")
_ARITHMETIC = re.compile(r"\d\s*[-+*/^=\u00d7\u00f7]\s*\d")
_UNITS = re.compile(r"\d\s*(km/h|mph|km|kg|%|cm|meters|dollars)")
_QUESTION = re.compile(
    r"^\s*(question:\s*)?(what|why|how|who|when|where|which|can|could|should|is|are|do|does|"
    r"explain|tell me|describe the difference)\b",
    re.I,
)
_MATH_WORDS = frozenset({"solve", "calculate", "compute", "equation", "integral", "derivative",
                         "prove", "multiplied", "multiply", "multiplication", "divided",
                         "probability", "percent", "average"})  # fmt: skip
_MATH_STRONG = frozenset({"solve", "equation", "integral", "derivative", "probability", "prove",
                          "theorem", "factorial", "logarithm", "matrix", "eigenvalue",
                          "eigenvalues", "eigenvector"})  # fmt: skip
_MATH_PHRASES = ("how many", "how much", "step by step", "catch up", "sum of", "\\frac",
                 "\\sqrt", "\\int", "\\sum", "\\cdot")  # fmt: skip
_PROSE_WORDS = frozenset({"story", "poem", "essay", "novel", "narrative", "describe", "imagine",
                          "chapter", "scene", "lyrics"})  # fmt: skip
_PROSE_PHRASES = ("once upon a time", "letter to", "blog post")
_ECHO_WORDS = frozenset({"rewrite", "rename", "refactor", "reformat", "format", "convert", "fix",
                         "correct", "edit", "modify", "sort", "change", "update", "replace",
                         "remove", "extract", "copy", "repeat", "quote", "quoting", "unchanged",
                         "identical", "verbatim", "exactly"})  # fmt: skip
_ECHO_PHRASES = ("add type hints", "add types", "add comments", "add docstrings",
                 "add logging", "add tests", "keep everything", "keep the rest", "keep it",
                 "without changing")  # fmt: skip
_REFERENT_PREPOSITIONS = frozenset({"from", "in", "to", "of", "on"})
_REFERENT_NOUNS = frozenset({"report", "text", "passage", "document", "email", "article",
                             "paragraph", "data", "log", "code", "snippet", "function",
                             "transcript", "table", "rows", "list", "class", "script", "query",
                             "file", "json", "yaml", "csv"})  # fmt: skip
_FORMATS = frozenset({"json", "yaml", "csv", "xml", "table"})
_FORMAT_VERBS = frozenset({"as", "in", "into", "to", "return", "output", "produce", "emit",
                           "generate", "create", "write", "make"})  # fmt: skip
_CODE_VERBS = frozenset({"write", "implement", "create", "generate", "code", "build"})
_TRIGGERS: frozenset[str]  # words that can start a phrase _asks looks for (set below)
_CODE_NOUNS = frozenset({"function", "class", "method", "script", "program", "query", "regex",
                         "module", "struct", "trait", "algorithm", "endpoint", "parser", "test",
                         "tests", "quicksort", "mergesort", "counter", "cli"})  # fmt: skip


_TRIGGERS = _REFERENT_PREPOSITIONS | _CODE_VERBS | _FORMAT_VERBS


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
        return {name: getattr(self, name) for name in self.__slots__}


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
    return _repeat_small(data, width, n) if len(data) < _SMALL else _repeat_numpy(data, width, n)


def _repeat_small(data: bytes, width: int, n: int) -> float:
    windows = Counter(data[i : i + width] for i in range(n))
    return sum(c for c in windows.values() if c > 1) / n


def _repeat_numpy(data: bytes, width: int, n: int) -> float:
    raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(width):  # an exact 64-bit packing of 8 bytes: no collisions
        h = (h << np.uint64(8)) | raw[j : j + n]
    h.sort()
    same = h[1:] == h[:-1]
    # every window equal to a neighbour in sorted order occurs at least twice
    repeated = np.zeros(n, dtype=bool)
    repeated[1:] |= same
    repeated[:-1] |= same
    return float(repeated.sum() / n)


def _window(text: str) -> str:
    if len(text) <= HEAD + TAIL:
        return text
    return text[:HEAD] + "\n" + text[-TAIL:]


@dataclass(slots=True)
class _Scan:
    """One pass over a window: lines with their flags, lower-cased text, word counts."""

    text: str
    lower: str
    lines: list[str]
    words: Counter[str]
    code_line: list[bool]
    table: int
    log: int
    yaml: int

    @classmethod
    def of(cls, text: str) -> _Scan:
        lower = text.lower()
        lines = text.splitlines()
        code_line: list[bool] = []
        table = log = yaml = 0
        is_code, add = _is_code_line, code_line.append
        for line in lines:
            add(is_code(line))
            first = line[:1]
            if first == "|" and line.rstrip().endswith("|"):
                table += 1
            if (first.isdigit() or first == "[" or first.isupper()) and _LOG_LINE.match(line):
                log += 1
            if _maybe_yaml(line) and _YAML_LINE.match(line) and not _LABELS.match(line):
                yaml += 1
        words = Counter(_WORD.findall(lower))
        return cls(text, lower, lines, words, code_line, table, log, yaml)

    def marks(self, markers: tuple[str, ...]) -> int:
        return sum(self.lower.count(m) for m in markers)


def _language_tag(window: str) -> str | None:
    if not any(mark in window for mark in _TAG_MARKS):
        return None
    tag = _LANGUAGE_TAG.search(window)
    if tag:
        name = tag.group(2).lower()
        return _TAG_NAMES.get(name, name)
    shebang = _SHEBANG.search(window) if "#!" in window else None
    if shebang:
        name = shebang.group(1).lower().rstrip("3")
        return {"sh": "shell", "bash": "shell", "node": "javascript"}.get(name, name)
    return None


_NOT_IN_KEYS = frozenset("()[]{}<>=,;\"'")


def _maybe_yaml(line: str) -> bool:
    """Cheap test before the YAML regex (which backtracks on code lines with colons)."""
    key, colon, _ = line.partition(":")
    return bool(colon) and len(key) <= 60 and not _NOT_IN_KEYS.intersection(key)


def _is_code_line(line: str) -> bool:
    stripped = line.rstrip()
    return stripped.endswith((";", "{", "}", "):")) or (
        line.startswith(("    ", "\t", "  ")) and bool(stripped.strip())
    )


def _code_language(scan: _Scan) -> tuple[str | None, int]:
    tagged = _language_tag(scan.text)
    if tagged:
        return tagged, 3
    scores = dict.fromkeys(_LANGUAGES, 0)
    for word, count in scan.words.items():  # one pass over the distinct words
        for name, weight in _WORD_INDEX.get(word, ()):
            scores[name] += weight * count
    for name, (_, markers) in _LANGUAGES.items():
        scores[name] += 2 * scan.marks(markers)
    if scores["typescript"] and scores["javascript"]:
        scores["typescript"] += scores["javascript"]
    sql = sum(scan.words[w] for w in _SQL_WORDS)
    distinct = sum(1 for w in _SQL_WORDS if scan.words[w])
    if distinct >= 3 and any(scan.words[a] and scan.words[b] for a, b in _SQL_OPENERS):
        scores["sql"] = 2 * sql
    name = max(scores, key=lambda k: scores[k])
    code_lines = sum(scan.code_line)
    strength = scores[name] // 2 + code_lines // 2
    if scores[name] >= 4 or (scores[name] >= 2 and code_lines >= 2):
        return name, strength
    return None, 0


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


def _data_format(scan: _Scan) -> tuple[str | None, int]:
    """The dominant structured format and how many lines it covers."""
    json_keys = len(_JSON_KEY.findall(scan.text)) if '":' in scan.text or '" :' in scan.text else 0
    csv = _csv_lines(scan.lines)
    scores = {"json": json_keys, "table": scan.table, "log": scan.log, "csv": csv,
              "yaml": scan.yaml if scan.yaml >= 3 else 0}  # fmt: skip
    name = max(scores, key=lambda k: scores[k])
    return (name, scores[name]) if scores[name] >= 2 else (None, 0)


def _material_lines(scan: _Scan, code: str | None, data: str | None) -> int:
    """Lines inside fences, quoted passages, or that look like code or data."""
    count, fenced, quoted = 0, False, False
    for line, code_like in zip(scan.lines, scan.code_line, strict=True):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if not stripped:
            quoted = False
            continue
        if ":" in stripped[:16] and _MATERIAL_START.match(stripped):
            quoted = True
        looks = (
            fenced
            or quoted
            or stripped.startswith(">")
            or (code is not None and (code_like or _has_code_word(stripped, code)))
            or (data is not None and ("," in line or stripped.startswith("|") or (
                _maybe_yaml(line) and bool(_YAML_LINE.match(line))) or bool(_LOG_LINE.match(line))))
        )  # fmt: skip
        count += looks
    return count


_SQL_MARKERS = ("select ", "from ", "where ", "join ", "group by", "order by", "insert ",
                "update ", "values", "limit ")  # fmt: skip


def _has_code_word(line: str, language: str) -> bool:
    """A line with one of the language's markers (substring checks only: this runs per line)."""
    lower = line.lower()
    markers = _SQL_MARKERS if language == "sql" else _LANGUAGES.get(language, ({}, ()))[1]
    return any(m in lower for m in markers)


def _digit_share(text: str) -> float:
    return len(_DIGIT.findall(text)) / max(len(text), 1)


@dataclass(frozen=True, slots=True)
class _Asks:
    """What the instruction asks for, from its words."""

    echo: bool
    code: bool
    format: str | None
    prose: bool


def _asks(instruction: str) -> _Asks:
    head = instruction[:INSTRUCTION].lower()
    words = _WORD.findall(head)
    echo = any(w in _ECHO_WORDS for w in words) or any(p in head for p in _ECHO_PHRASES)
    code = fmt = None
    for i, word in enumerate(words):
        if word not in _TRIGGERS:
            continue
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if not echo and word in _REFERENT_PREPOSITIONS and nxt in ("this", "these", "the"):
            rest = words[i + 2 : i + 4]
            noun = rest[1] if rest[:1] in (["following"], ["above"]) and len(rest) > 1 else (
                rest[0] if rest else "")  # fmt: skip
            echo = noun in _REFERENT_NOUNS
        if code is None and word in _CODE_VERBS:
            code = any(w in _CODE_NOUNS for w in words[i + 1 : i + 12]) or None
        if fmt is None and word in _FORMAT_VERBS:
            for candidate in words[i + 1 : i + 4]:
                if candidate in _FORMATS:
                    fmt = candidate
                    break
                if candidate not in ("valid", "a", "an", "markdown"):
                    break
    if fmt is None and ("respond with" in head or "give me" in head):
        fmt = next((w for w in words if w in _FORMATS), None)
    if not code and "give me" in head:
        code = any(w in _CODE_NOUNS for w in words) or None
    prose = any(w in _PROSE_WORDS for w in words) or any(p in head for p in _PROSE_PHRASES)
    return _Asks(echo, bool(code), fmt, prose)


def _is_math(scan: _Scan) -> bool:
    hits = sum(scan.words[w] for w in _MATH_WORDS) + sum(scan.words[w] for w in _MATH_STRONG)
    hits += sum(scan.lower.count(p) for p in _MATH_PHRASES)
    digits = _digit_share(scan.text[:HEAD])
    if digits or _DIGIT.search(scan.text):
        hits += len(_ARITHMETIC.findall(scan.text)) + len(_UNITS.findall(scan.lower))
    return hits >= 2 or (hits >= 1 and digits > 0.05) or digits > 0.3


def _content_type(view: PromptView, scan: _Scan, asks: _Asks) -> tuple[str, str | None]:
    code, code_strength = _code_language(scan)
    data, data_lines = _data_format(scan)
    n = max(len(scan.lines), 1)
    if data and data_lines / n >= 0.3 and data_lines >= code_strength:
        return "data", data
    if code and code_strength >= 2:
        return "code", code
    if asks.format:
        return "data", asks.format
    if asks.code:
        return "code", code
    if data and data_lines >= 3:
        return "data", data
    if _is_math(scan):
        return "math", None
    instruction = view.instruction.strip()
    if asks.prose:
        return "prose", None
    if (
        instruction.endswith("?")
        or "?\n" in instruction[-400:]
        or (_QUESTION.match(instruction) and len(instruction) < 600)
    ):
        return "question", None
    letters = 1 - len(_NOT_LETTER.findall(scan.text)) / max(len(scan.text), 1)
    if letters > 0.85 and len(scan.text) >= 40:
        return "prose", None
    return ("question" if view.chat else "other"), None


def extract(view: PromptView, body: dict[str, Any] | None = None) -> Features:
    """All features of one prompt; ``body`` supplies the sampling parameters."""
    body = body or {}
    # In a chat, what is asked now (not tool output or history) sets the type.
    scan = _Scan.of(_window(view.instruction if view.chat else view.text))
    asks = _asks(view.instruction)
    content, subtype = _content_type(view, scan, asks)
    material_scan = scan if not view.chat else _Scan.of(_window(view.text))
    code = subtype if content == "code" else None
    data = subtype if content == "data" else None
    material = _material_lines(material_scan, code, data) / max(len(material_scan.lines), 1)
    encoded = view.text.encode("utf-8", errors="replace")
    repeat = repeat_ratio(encoded[-REPEAT_WINDOW:])
    instruction_score = (0.55 if asks.echo else 0.0) + 0.45 * min(1.0, 1.5 * material)
    echo = max(instruction_score if asks.echo else 0.5 * instruction_score, min(1.0, 2.5 * repeat))
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
        echo_instruction=asks.echo,
        material_share=round(material, 4),
        repeat_ratio=round(repeat, 4),
        length_tokens=tokens,
        length_bucket="short" if tokens < 256 else "medium" if tokens < 2048 else "long",
        temperature=temp,
        sampling="greedy" if greedy else "sampled",
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        chat=view.chat,
    )
