"""Object ids from URLs and query strings, parsed strictly.

An id is ASCII digits naming a value a primary key can hold (a bigint). Python's ``int()`` and
``str.isdigit()`` also accept other scripts' digits and superscripts (``"²"``), and a number past the
column's range fails inside the database, so neither is used on an id from a request: `parse_id` and the
``<id:...>`` path converter are. A URL whose id does not parse matches no route (404).

Importing this module registers the converter; every ``urls.py`` that uses ``<id:...>`` imports it.
"""

from __future__ import annotations

import re

from django.urls import register_converter

MAX_ID = 2**63 - 1  # BigAutoField's largest value
_DIGITS = re.compile(r"[0-9]{1,19}", re.ASCII)


def parse_id(text: str) -> int | None:
    """The id `text` spells, or None when it is not 1-19 ASCII digits within ``0..MAX_ID``."""
    if not _DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if value <= MAX_ID else None


class IdConverter:
    """``<id:name>``: like Django's ``<int:name>``, but a value outside the bigint range matches nothing."""

    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        parsed = parse_id(value)
        if parsed is None:
            raise ValueError(f"{value!r} is not an id.")  # Django treats this as "no match"
        return parsed

    def to_url(self, value: int) -> str:
        return str(int(value))


register_converter(IdConverter, "id")
