"""The built-in sample chat data: short conversations generated here, so that a new installation can fine-tune on
chat data with no upload and no internet.

Every answer follows from its question (sums and products, unit conversions, letter counts), so a model trained
on it has something to learn. The conversations are the same on every call: a fixed list of words and numbers
drawn from a seeded generator. Every fourth has a system message, every third a second question and answer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

SAMPLE_CHAT_NAME = "Chat arithmetic and facts (built-in sample)"
SAMPLE_CHAT_FILENAME = "sample-chat.jsonl"
CONVERSATIONS = 400
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
WORDS = ("banana", "apple", "cherry", "hydra", "tokenizer", "lemon", "orange", "graph", "python", "kernel",
         "window", "garden", "planet", "violin", "mountain", "river", "pencil", "rocket", "shadow", "tensor")
UNITS = (  # (unit, its plural, the smaller unit's plural, how many of them make one)
    ("metre", "metres", "centimetres", 100), ("kilogram", "kilograms", "grams", 1000),
    ("hour", "hours", "minutes", 60), ("minute", "minutes", "seconds", 60), ("kilometre", "kilometres", "metres", 1000),
    ("litre", "litres", "millilitres", 1000), ("day", "days", "hours", 24), ("foot", "feet", "inches", 12),
)

Message = dict[str, str]
Turn = tuple[str, str]  # (question, answer)


def sample_chat_rows() -> list[dict[str, list[Message]]]:
    """`CONVERSATIONS` rows of ``{"messages": [...]}``, the same on every call."""
    rng = random.Random(0)
    makers: tuple[Callable[[random.Random], list[Turn]], ...] = (_sum, _product, _conversion, _letters)
    rows = []
    for number in range(CONVERSATIONS):
        turns = makers[number % len(makers)](rng)
        if number % 3 != 2:
            turns = turns[:1]
        messages = [{"role": "system", "content": SYSTEM}] if number % 4 == 3 else []
        for question, answer in turns:
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages})
    return rows


def sample_chat_jsonl() -> str:
    """The sample as JSONL: one conversation a line."""
    return "".join(json.dumps(row) + "\n" for row in sample_chat_rows())


def _sum(rng: random.Random) -> list[Turn]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return [(f"What is {a} + {b}?", f"{a} + {b} = {a + b}."),
            ("And if you double that?", f"Doubled, it is {2 * (a + b)}.")]


def _product(rng: random.Random) -> list[Turn]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return [(f"What is {a} times {b}?", f"{a} times {b} is {a * b}."),
            (f"And {a} times {b + 1}?", f"{a} times {b + 1} is {a * (b + 1)}.")]


def _conversion(rng: random.Random) -> list[Turn]:
    unit, units, smaller, factor = rng.choice(UNITS)
    count = rng.randint(2, 9)
    return [(f"How many {smaller} are in {count} {units}?", f"{count} {units} is {count * factor} {smaller}."),
            (f"And in one {unit}?", f"One {unit} is {factor} {smaller}.")]


def _letters(rng: random.Random) -> list[Turn]:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    times = word.count(letter)
    return [(f"How many letters are in '{word}'?", f"'{word}' has {len(word)} letters."),
            (f"How many times does '{letter}' appear in it?",
             f"'{letter}' appears {times} time{'' if times == 1 else 's'} in '{word}'.")]
