"""The GBNF check: what llama.cpp's parser accepts passes, what it refuses is named. The
same corpus against the real mainline server's own parser: ``tests/integration/
test_grammar_real.py``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.proxy.grammar import grammar_error

VALID = [
    'root ::= "yes" | "no"',
    'root ::= [a-z]+ ( "-" [a-z]+ )*\n',
    'root ::= item{2,5} "."\nitem ::= [^"\\\\] | "\\\\" ["\\\\nrt]\n',
    '# a comment\nroot ::= num ("," num)?  # trailing\nnum ::= [0-9]{1,}\n',
    'root ::= "\\x41\\u00e9\\U0001F600" .',
    'root ::= (\n  "a"\n  | "b"\n)\n',  # across lines inside a group only
    'root ::= "a" |',
    "root ::= <[12]> !<[3]> x\nx ::= [-a]",
    "",
    "%llguidance {}",
]
INVALID = {
    "root ::= (": "expecting ')'",
    'root ::= "unterminated': "unexpected end of input",
    "root ::= [a-": "unexpected end of input",
    'root = "a"': "expecting ::=",
    'root ::= "a" other': "undefined rule 'other'",
    'item ::= "a"': "no 'root' rule",
    "root ::= *": "expecting an item",
    'root ::= "a"{x}': "expecting an integer",
    'root ::= "a"{1,2': "expecting '}'",
    'root ::= "\\q"': "unknown escape",
    'root ::= "\\x4"': "hex chars",
    'root ::= "a" )': "expecting newline or end",
    "root ::= <[1]": "expecting '>'",
    'root ::= \n  "a"\n  | "b"\n': "expecting name",  # a rule ends at its line's end
    'root ::= "a"{5000}': "repetitions exceeds",
}


def test_what_llama_cpp_accepts_passes() -> None:
    for text in VALID:
        assert grammar_error(text) is None, text


def test_what_llama_cpp_refuses_is_named() -> None:
    for text, why in INVALID.items():
        problem = grammar_error(text)
        assert problem is not None and why in problem, (text, problem)


@given(st.text(alphabet='root:=|"ab()[]*+?{}0-9,\\ \n#.<>!^x', max_size=40))
def test_any_text_gets_a_verdict_never_an_exception(text: str) -> None:
    problem = grammar_error(text)
    assert problem is None or (isinstance(problem, str) and problem)
