"""Write benchmarks/workloads/fresh.jsonl: 520 distinct prompts, none sent twice.

``dev.jsonl`` has 41 prompts, so a 520-request run sends each about 13 times, and an
``ngram-mod`` table that has seen a prompt's answer drafts it back the next time: that
workload measures memorising verbatim repeats as much as drafting. This one is the other
regime, closer to a local server's traffic: every request is new, drawn from templates
of the same eight kinds as ``dev.jsonl`` (code edits, code generation, JSON extraction,
summarizing with quotes, prose, chat questions, math, list continuation), 65 of each, with
random names, numbers and code, so prompts of a kind share their shape but never their
text. Of each kind's 65, 13 are sent in chat form (a system message and the prompt as the
user's turn) and 13 sampled (temperature 0.8, a fixed seed per item); the rest are greedy
completions. Deterministic: ``python -m benchmarks.workloads.make_fresh [--seed 0]``.

A longer run of new prompts: ``--per-kind 130 --seed 1 --out
benchmarks/workloads/fresh1040.jsonl`` writes 1,040 (a fifth of each kind in chat form, a
fifth sampled, as above), all distinct, drawn with another seed. Each run starts from empty
tables, so that some match ``fresh.jsonl``'s (the code-generation and chat templates have
few fillings: 102 of the 1,040) does not matter. Those two templates give only 132 and 195
distinct prompts, so ``--per-kind`` above 132 is refused with an error naming the kind.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from benchmarks.workloads.make_dev import chat_messages

PER_KIND = 65
CHAT, SAMPLED = 13, 13  # of each kind's PER_KIND (a fifth each, for any per_kind)
GIVE_UP = 20_000  # draws in a row that repeat an earlier prompt: the template is used up

FIRST = [
    "Dana",
    "Mira",
    "Tomas",
    "Aiko",
    "Kwame",
    "Lena",
    "Ravi",
    "Sofia",
    "Jonas",
    "Amara",
    "Pedro",
    "Hana",
    "Oskar",
    "Nadia",
    "Felix",
    "Imani",
    "Yusuf",
    "Clara",
    "Mateo",
    "Ines",
]
LAST = [
    "Whitfield",
    "Okafor",
    "Rivera",
    "Lindqvist",
    "Tanaka",
    "Moreau",
    "Kowalski",
    "Haddad",
    "Brennan",
    "Sato",
    "Novak",
    "Mensah",
    "Castillo",
    "Fischer",
    "Duarte",
    "Petrov",
]
CITY = [
    "Springfield",
    "Porto",
    "Tampere",
    "Leeds",
    "Osaka",
    "Accra",
    "Lyon",
    "Gdansk",
    "Valencia",
    "Halifax",
    "Tartu",
    "Cork",
    "Ghent",
    "Bergen",
    "Dunedin",
    "Bilbao",
]
ITEM = [
    "kettle",
    "toaster",
    "lamp",
    "backpack",
    "notebook",
    "umbrella",
    "blender",
    "chair",
    "keyboard",
    "teapot",
    "scarf",
    "drill",
    "monitor",
    "pillow",
    "bicycle bell",
    "mug",
]
COLOR = ["blue", "red", "green", "black", "white", "grey", "yellow", "orange"]
TOPIC = [
    "bicycle lanes",
    "a new library",
    "park renovations",
    "bus fares",
    "school lunches",
    "street lighting",
    "a recycling scheme",
    "the harbour bridge",
    "flood defences",
    "a farmers market",
    "noise limits",
    "tree planting",
    "parking fees",
    "a skate park",
]
WORDS = [
    "total",
    "count",
    "result",
    "value",
    "score",
    "amount",
    "index",
    "offset",
    "limit",
    "price",
    "weight",
    "size",
    "delta",
    "buffer",
    "cursor",
    "budget",
]
THINGS = ["items", "orders", "rows", "users", "events", "records", "points", "files", "tasks"]
TIPS = [
    "sleeping better",
    "learning a language",
    "saving money",
    "running a first marathon",
    "keeping houseplants alive",
]
FIELDS = ["price", "quantity", "discount", "weight", "age", "duration", "rating", "cost"]


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _function(rng: random.Random) -> tuple[str, str]:
    """A small Python function and one local variable name in it."""
    var, other = rng.sample(WORDS, 2)
    things = rng.choice(THINGS)
    item = things[:-1]
    a, b, c = rng.sample(FIELDS, 3)
    fn = rng.choice(["summarize", "compute", "collect", "tally", "aggregate", "measure"])
    limit = rng.randint(2, 90)
    lines = [
        f"def {fn}_{things}({things}, {other}={limit}):",
        f"    {var} = 0",
        f"    for {item} in {things}:",
        f"        if {item}.{a} > {other}:",
        f"            {var} += {item}.{a} * {item}.{b}",
        f"        elif {item}.{c} < {rng.randint(1, 9)}:",
        f"            {var} -= {item}.{c}",
        "        else:",
        f"            {var} += {rng.randint(1, 5)}",
        f"    return {var}",
    ]
    return "\n".join(lines), var


def code_edit(rng: random.Random) -> str:
    body, var = _function(rng)
    new = rng.choice([w for w in ["acc", "running", "tally", "sum_", "out", "agg"] if w != var])
    task = rng.choice(
        [
            f"Rewrite the function below with the variable {var} renamed to {new}. "
            "Keep everything else identical.",
            "Add type hints to the function below without changing anything else.",
            "Add a one-line docstring to the function below. Keep the code identical.",
            "Rewrite the function below using four-space indentation and double quotes. "
            "Change nothing else.",
        ]
    )
    return f"{task}\n\n{body}\n\nRewritten:\n\n"


# (what the function does, its name, its arguments, what fills {x})
CODE_TASKS = [
    (
        "returns the n-th {x} number iteratively",
        "nth_{x}",
        "n",
        ["Fibonacci", "Lucas", "triangular", "Catalan"],
    ),
    (
        "checks whether a string is a palindrome, ignoring {x}",
        "is_palindrome",
        "text",
        ["case", "spaces", "punctuation"],
    ),
    (
        "counts how often each {x} occurs in a list",
        "count_{x}s",
        "values",
        ["word", "letter", "tag", "status"],
    ),
    (
        "merges two sorted lists of {x}s into one sorted list",
        "merge_{x}s",
        "left, right",
        ["integer", "date", "name"],
    ),
    (
        "parses a line of {x}-separated values, honouring quotes",
        "parse_line",
        "line",
        ["comma", "tab", "semicolon"],
    ),
    ("returns the {x} largest values of a list", "top_{x}", "values", ["three", "five", "ten"]),
    (
        "retries a call up to {x} times with exponential backoff",
        "retry",
        "fn",
        ["three", "five", "eight"],
    ),
    (
        "groups a list of records by their {x} field",
        "group_by_{x}",
        "records",
        ["city", "owner", "category", "year"],
    ),
    ("flattens a nested list up to depth {x}", "flatten", "items", ["two", "three", "four"]),
    (
        "converts a duration in {x} into a human-readable string",
        "format_{x}",
        "amount",
        ["seconds", "minutes", "days"],
    ),
]
LANGS = [
    ("Python", "#", "def {name}({args}):"),
    ("JavaScript", "//", "function {name}({args}) {{"),
    ("Go", "//", "func {name}({args}) {{"),
    ("Rust", "//", "fn {name}({args}) {{"),
]


def code_gen(rng: random.Random) -> str:
    desc, name, args, fills = rng.choice(CODE_TASKS)
    x = rng.choice(fills)
    lang, comment, head = rng.choice(LANGS)
    ident = name.format(x=x.lower().replace(" ", "_"))
    return (
        f"{comment} {lang}\n{comment} A function that {desc.format(x=x)}.\n"
        + head.format(name=ident, args=args)
        + "\n"
    )


def json_extract(rng: random.Random) -> str:
    if rng.random() < 0.5:
        n1, n2 = rng.randint(1, 4), rng.randint(1, 3)
        i1, i2 = rng.sample(ITEM, 2)
        p1, p2 = rng.randint(3, 60) + 0.99, rng.randint(3, 60) + 0.5
        return (
            "Extract the order as JSON with keys order_id, customer, items (name, quantity, "
            f"unit_price), address.\n\nText: Order {rng.randint(1000, 9999)} was placed by "
            f"{_name(rng)} on {rng.choice(['March', 'May', 'July', 'October'])} "
            f"{rng.randint(1, 28)} for {n1} {rng.choice(COLOR)} {i1}s at {p1:.2f} each and "
            f"{n2} {i2}s at {p2:.2f} each. Shipping to {rng.randint(1, 220)} "
            f"{rng.choice(['Elm Court', 'Mill Lane', 'Harbour Road', 'Oak Street'])}, "
            f"{rng.choice(CITY)}. Paid by card ending {rng.randint(0, 9999):04d}.\n\nJSON:\n"
        )
    who, other = _name(rng), _name(rng)
    yes, no = rng.randint(3, 12), rng.randint(0, 8)
    return (
        "Return a JSON object with fields city, day, topic, speaker, votes_for, votes_against "
        f"from this report.\n\nReport: The council of {rng.choice(CITY)} met on "
        f"{rng.choice(['Monday', 'Tuesday', 'Thursday', 'Friday'])} to discuss "
        f"{rng.choice(TOPIC)}. Council member {who} said the plan would cost "
        f"{rng.randint(2, 90)} thousand euros. Council member {other} asked for a delay. "
        f"The motion passed with {yes} votes for and {no} against.\n\nJSON:\n"
    )


def _report(rng: random.Random) -> tuple[str, str]:
    who, other = _name(rng), _name(rng)
    topic = rng.choice(TOPIC)
    pct = rng.randint(5, 40)
    text = (
        f"The council of {rng.choice(CITY)} met on {rng.choice(['Monday', 'Wednesday', 'Friday'])} "
        f'to discuss {topic}. Council member {who} said, "{topic.capitalize()} cut complaints '
        f'by {pct} percent in the first year, and we should keep going." Council member '
        f'{other} said, "We cannot spend more until the budget for '
        f'{rng.choice(TOPIC)} is settled." The council will vote again in '
        f"{rng.choice(['two weeks', 'a month', 'the spring'])}."
    )
    return text, who


def summarize_quote(rng: random.Random) -> str:
    text, who = _report(rng)
    task = rng.choice(
        [
            f"Summarize the report in two sentences, quoting {who} exactly.",
            "Repeat the following paragraph exactly, then list its three main points.",
            "Quote every sentence of the report that contains a number, one per line.",
        ]
    )
    return f"{task}\n\nReport: {text}\n\n"


def prose(rng: random.Random) -> str:
    who = rng.choice(
        [
            "a lighthouse keeper",
            "a retired pilot",
            "a young baker",
            "a night nurse",
            "a street musician",
            "a beekeeper",
            "a ferry captain",
            "a librarian",
        ]
    )
    what = rng.choice(
        [
            "finds a strange object on the beach",
            "receives a letter from the past",
            "loses a key that opens nothing",
            "meets a talking fox",
            "hears a song nobody else can hear",
            "misses the last train home",
        ]
    )
    where = rng.choice(CITY)
    return rng.choice(
        [
            f"Write a short story about {who} in {where} who {what}.\n\nStory:\n",
            f"Describe a walk through {where} at {rng.choice(['dawn', 'dusk', 'midnight'])} in "
            "vivid detail.\n\n",
            f"Write a poem about {who} who {what}.\n\n",
            f"The {rng.choice(['old', 'empty', 'flooded'])} "
            f"{rng.choice(['station', 'mill', 'school'])}"
            f" in {where} had been closed for {rng.randint(3, 60)} years when {rng.choice(FIRST)} "
            "found the key.",
        ]
    )


def chat(rng: random.Random) -> str:
    a, b = rng.sample(
        [
            "a fridge",
            "a heat pump",
            "a battery",
            "a solar panel",
            "a compass",
            "a microwave",
            "a thermostat",
            "a vaccine",
            "a tide",
            "a rainbow",
            "a credit card",
            "a password manager",
        ],
        2,
    )
    return (
        "Question: "
        + rng.choice(
            [
                f"How does {a} work?",
                f"What is the difference between {a} and {b}?",
                f"What are {rng.choice(['three', 'four', 'five'])} tips for {rng.choice(TIPS)}?",
                f"Why does {a} {rng.choice(['fail', 'wear out', 'need maintenance'])} over time?",
            ]
        )
        + "\nAnswer:"
    )


def math(rng: random.Random) -> str:
    v1, v2 = rng.randint(40, 90), rng.randint(60, 130)
    h = rng.randint(7, 11)
    return rng.choice(
        [
            f"Question: A train leaves at {h}:00 traveling {v1} km/h. Another leaves the same "
            f"station at {h + 1}:00 traveling {max(v2, v1 + 10)} km/h in the same direction. When "
            "does the second train catch up?\nAnswer: Let's think step by step.",
            f"Question: What is {rng.randint(12, 99)} multiplied by {rng.randint(12, 99)}? "
            "Show the work.\nAnswer:",
            f"Question: A shop sells {rng.choice(ITEM)}s at {rng.randint(3, 40)} euros. With a "
            f"{rng.choice([10, 15, 20, 25])} percent discount, how much do {rng.randint(2, 9)} "
            "cost?\nAnswer: Let's think step by step.",
            ", ".join(str(k * k) for k in range(rng.randint(1, 5), 14)) + ",",
        ]
    )


def listing(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
        start = rng.randrange(7)
        return ", ".join(days[(start + k) % 7] for k in range(rng.randint(8, 12))) + ","
    if kind == 1:
        fruits = rng.sample(
            [
                "apples",
                "bananas",
                "cherries",
                "dates",
                "elderberries",
                "figs",
                "grapes",
                "kiwis",
                "lemons",
                "mangoes",
                "nectarines",
                "plums",
            ],
            7,
        )
        lines = [f"- {f}: {rng.randint(1, 20)}" for f in fruits[:-1]]
        return "\n".join([*lines, f"- {fruits[-1]}:"])
    step = rng.randint(2, 9)
    start = rng.randint(1, 50)
    return "\n".join(f"{k + 1}. {rng.choice(CITY)}: {start + step * k}" for k in range(6)) + "\n7."


KINDS: dict[str, Callable[[random.Random], str]] = {
    "code-edit": code_edit,
    "code-gen": code_gen,
    "json-extract": json_extract,
    "summarize-quote": summarize_quote,
    "prose": prose,
    "chat": chat,
    "math": math,
    "list": listing,
}


def workload(seed: int = 0, per_kind: int = PER_KIND) -> list[dict[str, object]]:
    """``per_kind`` distinct items of every kind, in kind order (the bench shuffles)."""
    if per_kind < 1:
        raise ValueError("per_kind must be >= 1")
    chat, sampled = per_kind * CHAT // PER_KIND, per_kind * SAMPLED // PER_KIND
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    seen: set[str] = set()
    for kind, make in KINDS.items():
        made = repeats = 0
        while made < per_kind:
            prompt = make(rng)
            if prompt in seen:
                repeats += 1
                if repeats > GIVE_UP:
                    raise ValueError(f"{kind}: its template gave only {made} distinct prompts")
                continue
            repeats = 0
            seen.add(prompt)
            row: dict[str, object] = {
                "id": f"{kind}-{made:02d}",
                "class_hint": kind,
                "max_tokens": 128,
                "temperature": 0,
            }
            if made < chat:
                row["id"] = f"{row['id']}-chat"
                row["messages"] = chat_messages(prompt)
            elif made < chat + sampled:
                row.update(id=f"{row['id']}-sampled", prompt=prompt, temperature=0.8, seed=made)
            else:
                row["prompt"] = prompt
            out.append(row)
            made += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-kind", type=int, default=PER_KIND, help="prompts of each kind")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("fresh.jsonl"))
    args = parser.parse_args()
    try:
        rows = workload(args.seed, args.per_kind)
    except ValueError as e:
        parser.error(str(e))
    path = args.out
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} lines to {path}")


if __name__ == "__main__":
    main()
