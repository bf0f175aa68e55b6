"""The classifier's vocabulary: word lists, substring markers and line patterns. Data only.

Kept apart from the logic in ``features`` so the words can be read and adjusted at a
glance. Sets and tuples are scanned with ``in``/``count``; the few regular expressions
are anchored or start with a character class, so the engine skips ahead cheaply.
"""

from __future__ import annotations

import re

# Words of lower-cased text: runs of [a-z0-9_] (and non-ASCII letters); every other ASCII
# character separates. ``text.translate(WORD_BREAKS).split()``: faster than a regex.
WORD_BREAKS = str.maketrans(
    {chr(i): " " for i in range(128) if not (chr(i).isalnum() or chr(i) == "_")}
)

# language -> (keyword weights, substring markers counted in the lower-cased window)
LANGUAGES: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    "python": (
        {
            "def": 2,
            "elif": 3,
            "self": 2,
            "none": 1,
            "lambda": 2,
            "__init__": 3,
            "isinstance": 3,
            "kwargs": 3,
        },
        ("):\n", "import ", "print(", "self.", "return "),
    ),
    "javascript": (
        {"const": 2, "let": 1, "var": 1, "function": 2, "console": 2, "undefined": 2, "require": 2},
        ("=>", "===", "console.log", "});", "export default"),
    ),
    "typescript": ({"interface": 2}, (": string", ": number", ": boolean")),
    "go": (
        {"func": 3, "fmt": 3, "chan": 2, "defer": 3, "goroutine": 3},
        (":=", "go func", "err != nil", "package main"),
    ),
    "rust": (
        {"fn": 3, "impl": 3, "mut": 2, "usize": 3, "trait": 2},
        ("println!", "::new(", "&mut", "pub fn"),
    ),
    "c": (
        {"printf": 3, "malloc": 3, "sizeof": 3, "std": 1},
        ("#include", "->", "std::", "int main("),
    ),
    "java": (
        {"extends": 2, "implements": 2, "override": 2},
        ("system.out", "@override", "public class", "public static void", "private final"),
    ),
    "shell": (
        {"sudo": 3, "grep": 2, "esac": 3, "apt": 2, "mkdir": 2},
        ("#!/bin", "\n$ ", "&& ", "\nexport ", "\ncd ", "\necho "),
    ),
    "html": ({"div": 2, "span": 2, "href": 3, "li": 1, "ul": 1}, ("</", "/>")),
}
# word -> ((language, weight), ...): language keywords indexed once
WORD_INDEX: dict[str, tuple[tuple[str, int], ...]] = {}
for _name, (_weights, _) in LANGUAGES.items():
    for _word, _weight in _weights.items():
        WORD_INDEX[_word] = (*WORD_INDEX.get(_word, ()), (_name, _weight))
KEYWORDS = frozenset(WORD_INDEX)  # intersected with a window's words: only the hits are read
SQL_OPENERS = (
    ("select", "from"),
    ("insert", "into"),
    ("create", "table"),
    ("delete", "from"),
    ("update", "set"),
)
SQL_WORDS = frozenset(
    {
        "select",
        "from",
        "where",
        "join",
        "group",
        "order",
        "limit",
        "insert",
        "into",
        "update",
        "delete",
        "create",
        "table",
        "count",
        "having",
    }
)
YAML_LINE = re.compile(r"^\s*-?\s*[\w.-]{1,30}( [\w.-]{1,20})?:(\s+[^\s.!?][^.!?]{0,60})?$")
LOG_LINE = re.compile(
    r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|^(INFO|WARN|WARNING|ERROR|DEBUG|TRACE)\b|"
    r"^\w{3} \d{1,2} \d{2}:\d{2}:\d{2}"
)
JSON_KEY = re.compile(r'"[^"\n]{1,60}"\s*:')
# "Question: ...", "Text: ..." are prompt labels, not YAML keys (compared with the key,
# stripped and lower-cased: a set lookup, not a case-insensitive regex per line)
LABEL_NAMES = frozenset(
    {
        "question",
        "answer",
        "text",
        "passage",
        "paragraph",
        "report",
        "story",
        "input",
        "output",
        "context",
        "rewritten",
        "converted",
        "reformatted",
        "with type hints",
        "summary",
        "email",
        "article",
        "q",
        "a",
    }
)
MATERIAL_START = re.compile(
    r"^(text|passage|paragraph|report|article|document|input|code|email|transcript|"
    r"context|data)\s*:",
    re.I,
)
# "# Python", "// JavaScript", "-- SQL", "```python": the prompt names its language
LANGUAGE_TAG = re.compile(
    r"^\s*(#|//|--|```)\s*(python|javascript|typescript|js|ts|sql|go|golang|rust|c|c\+\+|cpp|"
    r"java|bash|shell|sh|html|ruby|php|kotlin|swift|csharp|c#)\b",
    re.I | re.M,
)
TAG_MARKS = ("#", "//", "--", "```")  # a tag needs one of these: skip the regex otherwise
SHEBANG = re.compile(r"^#!\S*?(bash|sh|python3?|node|perl|ruby)\b", re.M)
TAG_NAMES = {
    "js": "javascript",
    "ts": "typescript",
    "golang": "go",
    "c++": "c",
    "cpp": "c",
    "bash": "shell",
    "sh": "shell",
}
DIGIT = re.compile(r"\d")
# Deleting ASCII letters and whitespace (``str.isspace``, as ``\s`` in ``re``) leaves what
# ``[^a-zA-Z\s]`` matches: one ``translate`` instead of a ``findall`` list per character.
_SPACES = [i for i in range(0x3001) if chr(i).isspace()]  # none above U+3000
LETTERS_AND_SPACE = str.maketrans(dict.fromkeys([*range(65, 91), *range(97, 123), *_SPACES]))
ARITHMETIC = re.compile(r"\d\s*[-+*/^=\u00d7\u00f7]\s*\d")
UNITS = re.compile(r"\d\s*(km/h|mph|km|kg|%|cm|meters|dollars)")
QUESTION = re.compile(
    r"^\s*(question:\s*)?(what|why|how|who|when|where|which|can|could|should|is|are|do|does|"
    r"explain|tell me|describe the difference)\b",
    re.I,
)
MATH_WORDS = frozenset(
    {
        "solve",
        "calculate",
        "compute",
        "equation",
        "integral",
        "derivative",
        "prove",
        "multiplied",
        "multiply",
        "multiplication",
        "divided",
        "probability",
        "percent",
        "average",
    }
)
MATH_STRONG = frozenset(
    {
        "solve",
        "equation",
        "integral",
        "derivative",
        "probability",
        "prove",
        "theorem",
        "factorial",
        "logarithm",
        "matrix",
        "eigenvalue",
        "eigenvalues",
        "eigenvector",
    }
)
MATH_PHRASES = (
    "how many",
    "how much",
    "step by step",
    "catch up",
    "sum of",
    "\\frac",
    "\\sqrt",
    "\\int",
    "\\sum",
    "\\cdot",
)
PROSE_WORDS = frozenset(
    {
        "story",
        "poem",
        "essay",
        "novel",
        "narrative",
        "describe",
        "imagine",
        "chapter",
        "scene",
        "lyrics",
    }
)
PROSE_PHRASES = ("once upon a time", "letter to", "blog post")
ECHO_WORDS = frozenset(
    {
        "rewrite",
        "rename",
        "refactor",
        "reformat",
        "format",
        "convert",
        "fix",
        "correct",
        "edit",
        "modify",
        "sort",
        "change",
        "update",
        "replace",
        "remove",
        "extract",
        "copy",
        "repeat",
        "quote",
        "quoting",
        "unchanged",
        "identical",
        "verbatim",
        "exactly",
    }
)
ECHO_PHRASES = (
    "add type hints",
    "add types",
    "add comments",
    "add docstrings",
    "add logging",
    "add tests",
    "keep everything",
    "keep the rest",
    "keep it",
    "without changing",
)
REFERENT_PREPOSITIONS = frozenset({"from", "in", "to", "of", "on"})
REFERENT_NOUNS = frozenset(
    {
        "report",
        "text",
        "passage",
        "document",
        "email",
        "article",
        "paragraph",
        "data",
        "log",
        "code",
        "snippet",
        "function",
        "transcript",
        "table",
        "rows",
        "list",
        "class",
        "script",
        "query",
        "file",
        "json",
        "yaml",
        "csv",
    }
)
FORMATS = frozenset({"json", "yaml", "csv", "xml", "table"})
FORMAT_VERBS = frozenset(
    {
        "as",
        "in",
        "into",
        "to",
        "return",
        "output",
        "produce",
        "emit",
        "generate",
        "create",
        "write",
        "make",
    }
)
CODE_VERBS = frozenset({"write", "implement", "create", "generate", "code", "build"})
CODE_NOUNS = frozenset(
    {
        "function",
        "class",
        "method",
        "script",
        "program",
        "query",
        "regex",
        "module",
        "struct",
        "trait",
        "algorithm",
        "endpoint",
        "parser",
        "test",
        "tests",
        "quicksort",
        "mergesort",
        "counter",
        "cli",
    }
)


TRIGGERS = REFERENT_PREPOSITIONS | CODE_VERBS | FORMAT_VERBS
NOT_IN_KEYS = frozenset("()[]{}<>=,;\"'")
SQL_MARKERS = (
    "select ",
    "from ",
    "where ",
    "join ",
    "group by",
    "order by",
    "insert ",
    "update ",
    "values",
    "limit ",
)


# A marker's gate is a character it contains that most text lacks: a marker whose gate is
# absent cannot occur, so ``count`` (a scan of the whole window) is skipped. One
# ``in`` per gate character (memchr) per window decides for every marker.
_RAREST_FIRST = "\\@$#!&<>{};|~=/:()-.,"  # in prose and code alike, roughly


def _gate(marker: str) -> str:
    return next((c for c in _RAREST_FIRST if c in marker), "")


def gated(key: str, markers: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """(key, marker, gate character or "" for none) triples: what ``_Scan.marks`` counts,
    summed per key."""
    return tuple((key, m, _gate(m)) for m in markers)


# every language's markers in one flat tuple: one loop counts them all
LANGUAGE_MARKS = tuple(t for name, (_, ms) in LANGUAGES.items() for t in gated(name, ms))
MATH_PHRASE_MARKS = gated("math", MATH_PHRASES)
GATES = "".join(sorted({g for _, _, g in (*LANGUAGE_MARKS, *MATH_PHRASE_MARKS) if g}))

# A short completion prompt (a few lines: what an editor sends with a signature, an import
# or a fill-in-the-middle prefix) is code when one of its lines opens like code. Case
# matters: prose says "Imports of steel", code "import numpy". (line pattern, language)
SHORT_LINES = 8
CODE_OPENERS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), language)
    for pattern, language in (
        (r"(?:async )?def \w+\s*\(|class \w+\s*[:(]|from [\w.]+ import |import \w[\w.]*(?: as \w+)?\s*$|@\w+\s*$|if __name__ ==", "python"),  # noqa: E501
        (r"def \w+(?:\(|\s*$)|require ['\"]|end\s*$", "ruby"),
        (r"function\*?\s*\w*\s*\(|(?:export )?(?:const|let|var) \w+\s*=|export (?:default|const|function)|\w+\s*=>", "javascript"),  # noqa: E501
        (r"interface \w+\s*\{|type \w+\s*=", "typescript"),
        (r"func (?:\(\w+ \*?\w+\) )?\w+\s*\(|package \w+\s*$", "go"),
        (r"(?:pub )?fn \w+|use \w+(?:::\w+)+|impl\b.*\{|(?:pub )?struct \w+\s*\{", "rust"),
        (r"#include\s*[<\"]|(?:int|void|char|static|template)\b[^;=]*\(.*\)\s*\{|template\s*<", "c"),  # noqa: E501
        (r"(?:public|private|protected) (?:static |final |abstract )*(?:class|interface|void|\w+(?:<[^>]*>)?\s+\w+\s*\()", "java"),  # noqa: E501
        (r"#!/", "shell"),
        (r"<!DOCTYPE html|<html\b|<div\b|<\?php", "html"),
    )
)  # fmt: skip
# fill-in-the-middle markers (Qwen, StarCoder, CodeLlama, CodeGemma): code, whatever is around
FIM_MARKS = ("<|fim_prefix|>", "<fim_prefix>", "<PRE>", "<|fim_begin|>")
