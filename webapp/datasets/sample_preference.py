"""The built-in sample preference pairs: questions with a chosen and a rejected answer, generated here, so that a
new installation can tune a chat model on preferences with no upload and no internet.

The chosen answer is right and polite; the rejected one is wrong (a sum or product off by a little, a conversion
with the wrong factor, a letter count off by one) or rude and useless. The difference is plain in a few tokens,
so that a short DPO run of a small chat model learns to prefer the chosen answers (its preference accuracy
rises above one half). The pairs are the same on every call: drawn from a generator seeded with 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from webapp.datasets.sample_chat import UNITS, WORDS

SAMPLE_PAIRS_NAME = "Right or wrong answers (built-in sample preference pairs)"
SAMPLE_PAIRS_FILENAME = "sample-preference.jsonl"
PAIRS = 400
RUDE = ("Work it out yourself.", "Why would I tell you that?", "Not my problem.", "Look it up, I am busy.",
        "That is a silly question.", "Ask someone else.")

Pair = tuple[str, str, str]  # (prompt, chosen, rejected)


def sample_preference_rows() -> list[dict[str, str]]:
    """`PAIRS` rows of ``{"prompt", "chosen", "rejected"}`` strings, the same on every call: every third
    rejected answer is rude, the others wrong."""
    rng = random.Random(0)
    makers: tuple[Callable[[random.Random], Pair], ...] = (_sum, _product, _conversion, _letters)
    rows = []
    for number in range(PAIRS):
        prompt, chosen, rejected = makers[number % len(makers)](rng)
        if number % 3 == 2:
            rejected = rng.choice(RUDE)
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def sample_preference_jsonl() -> str:
    """The sample as JSONL: one pair a line."""
    return "".join(json.dumps(row) + "\n" for row in sample_preference_rows())


def _off(rng: random.Random, value: int) -> int:
    """`value` moved by 1 to 3 either way: a wrong answer that looks like a right one."""
    return value + rng.choice((-3, -2, -1, 1, 2, 3))


def _sum(rng: random.Random) -> Pair:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", f"{a} + {b} = {_off(rng, a + b)}."


def _product(rng: random.Random) -> Pair:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"What is {a} times {b}?", f"{a} times {b} is {a * b}.", f"{a} times {b} is {_off(rng, a * b)}."


def _conversion(rng: random.Random) -> Pair:
    _, units, smaller, factor = rng.choice(UNITS)
    count = rng.randint(2, 9)
    wrong = rng.choice([f for *_, f in UNITS if f != factor])
    return (f"How many {smaller} are in {count} {units}?", f"{count} {units} is {count * factor} {smaller}.",
            f"{count} {units} is {count * wrong} {smaller}.")


def _letters(rng: random.Random) -> Pair:
    word = rng.choice(WORDS)
    wrong = len(word) + rng.choice((-1, 1))
    return f"How many letters are in '{word}'?", f"'{word}' has {len(word)} letters.", f"'{word}' has {wrong} letters."
