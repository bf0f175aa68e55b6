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

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tuner.classify import lexicon as lx
from tuner.classify.bytestats import byte_entropy, repeat_ratio
from tuner.classify.prompt import PromptView
from tuner.records import requested_tokens

__all__ = ["Features", "byte_entropy", "extract", "repeat_ratio"]

HEAD, TAIL, REPEAT_WINDOW, TAIL_ENTROPY, INSTRUCTION = 256, 768, 1024, 512, 768


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
    gates: str  # the gate characters (lexicon.GATES) present in the text

    @classmethod
    def of(cls, text: str) -> _Scan:
        lower = text.lower()
        lines = text.splitlines()
        code_line: list[bool] = []
        table = log = yaml = 0
        add, log_line, yaml_line = code_line.append, lx.LOG_LINE, lx.YAML_LINE
        labels = lx.LABEL_NAMES
        for line in lines:  # hot: no helper calls for the common checks
            stripped = line.rstrip()
            add(stripped.endswith(_CODE_ENDS) or (line.startswith(_INDENTS) and bool(stripped)))
            first = line[:1]
            if first == "|" and stripped.endswith("|"):
                table += 1
            if (
                first.isdigit()
                or first == "["
                or (first.isupper() and (line[1:2].isupper() or line[3:4] == " "))
            ) and log_line.match(line):  # the pattern's three shapes, checked cheaply first
                log += 1
            if ":" in line:
                key = _yaml_key(line)
                if key is not None and yaml_line.match(line) and key.strip().lower() not in labels:
                    yaml += 1
        words = Counter(lower.translate(lx.WORD_BREAKS).split())
        gates = "".join(g for g in lx.GATES if g in lower)
        return cls(text, lower, lines, words, code_line, table, log, yaml, gates)

    def marks(self, markers: tuple[tuple[str, str, str], ...]) -> dict[str, int]:
        """Occurrences of the markers in the lower-cased text, summed per key: triples from
        ``lexicon.gated`` whose gates are among ``lexicon.GATES`` (the ones checked)."""
        lower, gates = self.lower, self.gates
        counts: dict[str, int] = {}
        for key, marker, gate in markers:
            if not gate or gate in gates:
                counts[key] = counts.get(key, 0) + lower.count(marker)
        return counts


def _language_tag(window: str) -> str | None:
    if not any(mark in window for mark in lx.TAG_MARKS):
        return None
    tag = lx.LANGUAGE_TAG.search(window)
    if tag:
        name = tag.group(2).lower()
        return lx.TAG_NAMES.get(name, name)
    shebang = lx.SHEBANG.search(window) if "#!" in window else None
    if shebang:
        name = shebang.group(1).lower().rstrip("3")
        return {"sh": "shell", "bash": "shell", "node": "javascript"}.get(name, name)
    return None


def _yaml_key(line: str) -> str | None:
    """The text before the line's first colon if the line may be YAML, else None.

    Cheap tests the YAML regex implies (it backtracks on code and prose lines with colons):
    a short key without brackets or quotes, of at most two words (and a list dash).
    """
    key, colon, _ = line.partition(":")
    if not colon or len(key) > 60 or not lx.NOT_IN_KEYS.isdisjoint(key) or len(key.split()) > 3:
        return None
    return key


# a code line ends like a statement or block, or is indented
_CODE_ENDS, _INDENTS = (";", "{", "}", "):"), ("    ", "\t", "  ")


def _code_language(scan: _Scan) -> tuple[str | None, int]:
    tagged = _language_tag(scan.text)
    if tagged:
        return tagged, 3
    scores = dict.fromkeys(lx.LANGUAGES, 0)
    words = scan.words
    for word in lx.KEYWORDS.intersection(words):  # the keywords present, not every word
        count = words[word]
        for name, weight in lx.WORD_INDEX[word]:
            scores[name] += weight * count
    for name, count in scan.marks(lx.LANGUAGE_MARKS).items():
        scores[name] += 2 * count
    if scores["typescript"] and scores["javascript"]:
        scores["typescript"] += scores["javascript"]
    present = lx.SQL_WORDS.intersection(scan.words)  # counts of present words are >= 1
    sql = sum(scan.words[w] for w in present)
    distinct = len(present)
    if distinct >= 3 and any(a in present and b in present for a, b in lx.SQL_OPENERS):
        scores["sql"] = 2 * sql
    name = max(scores, key=scores.__getitem__)
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
    json_keys = (
        len(lx.JSON_KEY.findall(scan.text)) if '":' in scan.text or '" :' in scan.text else 0
    )
    # a run of 3 lines with commas needs 3 commas: one count, not a line loop, decides that
    csv = _csv_lines(scan.lines) if scan.text.count(",") >= 3 else 0
    scores = {
        "json": json_keys,
        "table": scan.table,
        "log": scan.log,
        "csv": csv,
        "yaml": scan.yaml if scan.yaml >= 3 else 0,
    }
    name = max(scores, key=lambda k: scores[k])
    return (name, scores[name]) if scores[name] >= 2 else (None, 0)


def _looks_like_data(line: str, stripped: str) -> bool:
    if "," in line or stripped.startswith("|"):
        return True
    return (_yaml_key(line) is not None and bool(lx.YAML_LINE.match(line))) or bool(
        lx.LOG_LINE.match(line)
    )


def _material_lines(scan: _Scan, code: str | None, data: str | None) -> int:
    """Lines inside fences, quoted passages, or that look like code or data."""
    count, fenced, quoted = 0, False, False
    markers = _code_markers(code)
    # lower-casing neither adds nor removes line breaks: these are the lines, lower-cased
    lowered = scan.lower.splitlines() if code is not None else scan.lines
    for line, low, code_like in zip(scan.lines, lowered, scan.code_line, strict=True):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if not stripped:
            quoted = False
            continue
        if ":" in stripped[:16] and lx.MATERIAL_START.match(stripped):
            quoted = True
        looks = (
            fenced
            or quoted
            or stripped.startswith(">")
            or (code is not None and (code_like or _has_marker(low.strip(), markers)))
            or (data is not None and _looks_like_data(line, stripped))
        )
        count += looks
    return count


def _code_markers(language: str | None) -> tuple[str, ...]:
    if language is None:
        return ()
    return lx.SQL_MARKERS if language == "sql" else lx.LANGUAGES.get(language, ({}, ()))[1]


def _has_marker(lower: str, markers: tuple[str, ...]) -> bool:
    """A (lower-cased, stripped) line with one of the language's markers: substring checks
    only, this runs per line."""
    return any(marker in lower for marker in markers)


def _digit_share(text: str) -> float:
    return len(lx.DIGIT.findall(text)) / max(len(text), 1)


@dataclass(frozen=True, slots=True)
class _Asks:
    """What the instruction asks for, from its words."""

    echo: bool
    code: bool
    format: str | None
    prose: bool


def _asks(instruction: str) -> _Asks:
    head = instruction[:INSTRUCTION].lower()
    words = head.translate(lx.WORD_BREAKS).split()
    echo = not lx.ECHO_WORDS.isdisjoint(words) or any(p in head for p in lx.ECHO_PHRASES)
    code = fmt = None
    # Each rule below needs one of its nouns among the words: skip the scan when none can fire.
    can_fire = (
        (not echo and not lx.REFERENT_NOUNS.isdisjoint(words))
        or not lx.CODE_NOUNS.isdisjoint(words)
        or not lx.FORMATS.isdisjoint(words)
    )
    for i, word in enumerate(words if can_fire else ()):
        if word not in lx.TRIGGERS:
            continue
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if not echo and word in lx.REFERENT_PREPOSITIONS and nxt in ("this", "these", "the"):
            rest = words[i + 2 : i + 4]
            noun = (
                rest[1]
                if rest[:1] in (["following"], ["above"]) and len(rest) > 1
                else (rest[0] if rest else "")
            )
            echo = noun in lx.REFERENT_NOUNS
        if code is None and word in lx.CODE_VERBS:
            code = not lx.CODE_NOUNS.isdisjoint(words[i + 1 : i + 12]) or None
        if fmt is None and word in lx.FORMAT_VERBS:
            for candidate in words[i + 1 : i + 4]:
                if candidate in lx.FORMATS:
                    fmt = candidate
                    break
                if candidate not in ("valid", "a", "an", "markdown"):
                    break
    if fmt is None and ("respond with" in head or "give me" in head):
        fmt = next((w for w in words if w in lx.FORMATS), None)
    if not code and "give me" in head:
        code = not lx.CODE_NOUNS.isdisjoint(words) or None
    prose = not lx.PROSE_WORDS.isdisjoint(words) or any(p in head for p in lx.PROSE_PHRASES)
    return _Asks(echo, bool(code), fmt, prose)


def _is_math(scan: _Scan) -> bool:
    words = scan.words
    hits = sum(words[w] for w in lx.MATH_WORDS.intersection(words)) + sum(
        words[w] for w in lx.MATH_STRONG.intersection(words)
    )
    hits += scan.marks(lx.MATH_PHRASE_MARKS).get("math", 0)
    digits = _digit_share(scan.text[:HEAD])
    if digits or lx.DIGIT.search(scan.text):
        hits += len(lx.ARITHMETIC.findall(scan.text)) + len(lx.UNITS.findall(scan.lower))
    return hits >= 2 or (hits >= 1 and digits > 0.05) or digits > 0.3


def _short_code(scan: _Scan) -> str | None:
    """The language of a short prompt one of whose lines opens like code (``code`` for a
    fill-in-the-middle prompt, whose language the caller's scan may know); None if none."""
    if len(scan.lines) > lx.SHORT_LINES:
        return None
    if any(mark in scan.text for mark in lx.FIM_MARKS):
        return "code"
    for line in scan.lines:
        stripped = line.strip()
        for pattern, language in lx.CODE_OPENERS:
            if pattern.match(stripped):
                return language
    return None


def _content_type(view: PromptView, scan: _Scan, asks: _Asks) -> tuple[str, str | None]:
    code, code_strength = _code_language(scan)
    data, data_lines = _data_format(scan)
    n = max(len(scan.lines), 1)
    if data and data_lines / n >= 0.3 and data_lines >= code_strength:
        return "data", data
    if code and code_strength >= 2:
        return "code", code
    if not view.chat and (short := _short_code(scan)) is not None:
        return "code", code or short
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
        or (lx.QUESTION.match(instruction) and len(instruction) < 600)
    ):
        return "question", None
    letters = 1 - len(scan.text.translate(lx.LETTERS_AND_SPACE)) / max(len(scan.text), 1)
    if letters > 0.85 and len(scan.text) >= 40:
        return "prose", None
    return ("question" if view.chat else "other"), None


def _material_tail(text: str, instructed: bool) -> str:
    """What repetition is measured on: the prompt's tail, without a leading instruction.

    An edit instruction ("Rewrite this ...:") followed by a blank line is not material;
    counted in, it would dilute the material's repetition and lower echo.
    """
    if instructed:
        head, blank, rest = text[:INSTRUCTION].partition("\n\n")
        if blank and rest.strip():
            text = text[len(head) + 2 :]
    return text[-REPEAT_WINDOW:]


def extract(
    view: PromptView, body: dict[str, Any] | None = None, greedy_max_temperature: float = 0.01
) -> Features:
    """All features of one prompt; ``body`` supplies the sampling parameters.

    Sampling is greedy at ``temperature <= greedy_max_temperature`` or ``top_k == 1``.
    """
    body = body or {}
    # In a chat, what is asked now (not tool output or history) sets the type.
    window = _window(view.instruction if view.chat else view.text)
    scan = _Scan.of(window)
    asks = _asks(view.instruction)
    content, subtype = _content_type(view, scan, asks)
    material_window = _window(view.text) if view.chat else window
    material_scan = scan if material_window == window else _Scan.of(material_window)
    code = subtype if content == "code" else None
    data = subtype if content == "data" else None
    material = _material_lines(material_scan, code, data) / max(len(material_scan.lines), 1)
    encoded = view.text.encode("utf-8", errors="replace")
    repeat = repeat_ratio(_material_tail(view.text, asks.echo).encode("utf-8", "replace"))
    instruction_score = (0.55 if asks.echo else 0.0) + 0.45 * min(1.0, 1.5 * material)
    echo = max(instruction_score if asks.echo else 0.5 * instruction_score, min(1.0, 2.5 * repeat))
    tokens = len(encoded) // 4
    entropy = byte_entropy(encoded)
    # a prompt of at most TAIL_ENTROPY bytes is its own tail: the same number, computed once
    tail = encoded[-TAIL_ENTROPY:]
    tail_entropy = entropy if len(tail) == len(encoded) else byte_entropy(tail)
    temperature = body.get("temperature")
    temp = float(temperature) if isinstance(temperature, int | float) else None
    greedy = (temp is not None and temp <= greedy_max_temperature) or body.get("top_k") == 1
    max_tokens = requested_tokens(body)
    return Features(
        content_type=content,
        subtype=subtype,
        entropy=round(entropy, 4),
        tail_entropy=round(tail_entropy, 4),
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
