"""Whether a GBNF grammar parses, as llama.cpp's own parser reads it (``llama-grammar.cpp``
``llama_grammar_parser``): rules ``name ::= alternatives``, literals, character classes,
groups, ``.``, repetitions ``* + ? {m,n}``, tokens ``<...>``, comments; every rule it
refers to defined, and a ``root``.

Mainline refuses a grammar that does not parse; ik_llama.cpp 55d3c05 drops it and answers
unconstrained. So the proxy checks it, on every engine alike. Pure: text in, the first
problem (or None) out.
"""

from __future__ import annotations

__all__ = ["grammar_error"]

_ESCAPES = {"x": 2, "u": 4, "U": 8}
_SIMPLE_ESCAPES = set('trn\\"[]-')
_HEX = set("0123456789abcdefABCDEF")
MAX_REPETITIONS = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD


class _Bad(ValueError):
    pass


def grammar_error(text: str) -> str | None:
    """Why ``text`` is not a grammar llama.cpp accepts, or None when it is.

    >>> grammar_error('root ::= "yes" | "no"') is None
    True
    >>> grammar_error("root ::= (")
    "expecting ')' at end of input"
    >>> grammar_error('root ::= item\\nitem ::= [a-z]+ other')
    "undefined rule 'other'"
    """
    if not text.strip() or text.startswith("%llguidance"):  # no grammar; not GBNF
        return None
    parser = _Parser(text)
    try:
        parser.grammar()
    except _Bad as exc:
        return str(exc)
    undefined = sorted(parser.referenced - parser.defined)
    if undefined:
        return f"undefined rule '{undefined[0]}'"
    if "root" not in parser.defined:
        return "the grammar has no 'root' rule"
    return None


def _word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.defined: set[str] = set()
        self.referenced: set[str] = set()

    def at(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def where(self) -> str:
        rest = self.s[self.i : self.i + 20]
        return f"at {rest!r}" if rest else "at end of input"

    def space(self, newline_ok: bool) -> None:
        while (c := self.at()) and (c in " \t#" or (newline_ok and c in "\r\n")):
            if c == "#":
                while (c := self.at()) and c not in "\r\n":
                    self.i += 1
            else:
                self.i += 1

    def name(self) -> str:
        start = self.i
        while (c := self.at()) and _word(c):
            self.i += 1
        if self.i == start:
            raise _Bad(f"expecting name {self.where()}")
        return self.s[start : self.i]

    def integer(self) -> int:
        start = self.i
        while (c := self.at()) and c.isascii() and c.isdigit():
            self.i += 1
        if self.i == start:
            raise _Bad(f"expecting an integer {self.where()}")
        return int(self.s[start : self.i])

    def char(self) -> None:
        c = self.at()
        if not c:
            raise _Bad("unexpected end of input")
        if c != "\\":
            self.i += 1
            return
        kind = self.at(1)
        if kind in _ESCAPES:
            digits = self.s[self.i + 2 : self.i + 2 + _ESCAPES[kind]]
            if len(digits) != _ESCAPES[kind] or not set(digits) <= _HEX:
                raise _Bad(f"expecting {_ESCAPES[kind]} hex chars {self.where()}")
            self.i += 2 + _ESCAPES[kind]
        elif kind and kind in _SIMPLE_ESCAPES:
            self.i += 2
        else:
            raise _Bad(f"unknown escape {self.where()}")

    def grammar(self) -> None:
        self.space(True)
        while self.at():
            self.rule()

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if self.s[self.i : self.i + 3] != "::=":
            raise _Bad(f"expecting ::= {self.where()}")
        self.i += 3
        self.space(True)
        self.defined.add(name)
        self.alternates(nested=False)
        if self.at() == "\r":
            self.i += 2 if self.at(1) == "\n" else 1
        elif self.at() == "\n":
            self.i += 1
        elif self.at():
            raise _Bad(f"expecting newline or end {self.where()}")
        self.space(True)

    def alternates(self, nested: bool) -> None:
        self.sequence(nested)
        while self.at() == "|":
            self.i += 1
            self.space(True)
            self.sequence(nested)

    def sequence(self, nested: bool) -> None:
        item = False  # a symbol a repetition may follow
        while c := self.at():
            if c in "*+?{":
                if not item:
                    raise _Bad(f"expecting an item before */+/?/{{ {self.where()}")
                self.repetition()
            elif not self.symbol(c):
                break
            item = True
            self.space(nested)

    def symbol(self, c: str) -> bool:
        """One symbol starting at ``c``; False where none starts (the sequence ends)."""
        if c == '"':
            self.literal()
        elif c == "[":
            self.char_class()
        elif c in "<!":
            self.token()
        elif _word(c):
            self.referenced.add(self.name())
        elif c == "(":
            self.i += 1
            self.space(True)
            self.alternates(nested=True)
            if self.at() != ")":
                raise _Bad(f"expecting ')' {self.where()}")
            self.i += 1
        elif c == ".":
            self.i += 1
        else:
            return False
        return True

    def literal(self) -> None:
        self.i += 1
        while self.at() != '"':
            self.char()
        self.i += 1

    def char_class(self) -> None:
        self.i += 1
        if self.at() == "^":
            self.i += 1
        while self.at() != "]":
            self.char()
            if self.at() == "-" and self.at(1) != "]":
                if not self.at(1):
                    raise _Bad("unexpected end of input")
                self.i += 1
                self.char()
        self.i += 1

    def token(self) -> None:
        if self.at() == "!":
            self.i += 1
        if self.at() != "<":
            raise _Bad(f"expecting '<' {self.where()}")
        end = self.s.find(">", self.i)
        if end < 0:
            raise _Bad(f"expecting '>' {self.where()}")
        self.i = end + 1

    def repetition(self) -> None:
        if self.at() != "{":
            self.i += 1
            return
        self.i += 1
        self.space(True)
        low = self.integer()
        self.space(True)
        if self.at() == ",":
            self.i += 1
            self.space(True)
            if self.at().isdigit():
                self.integer()
                self.space(True)
        if self.at() != "}":
            raise _Bad(f"expecting '}}' {self.where()}")
        self.i += 1
        if low > MAX_REPETITIONS:
            raise _Bad("number of repetitions exceeds sane defaults")
