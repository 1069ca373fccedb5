"""CSV that a spreadsheet opens as data: no cell of text is ever run as a formula.

Excel, LibreOffice and Google Sheets read a cell whose text starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return as a formula, so a name such as ``=HYPERLINK("http://evil.example", "click")`` in a download
would run when the file is opened (CSV injection). As OWASP recommends, such text is written with a leading
single quote, which a spreadsheet shows as text. Numbers stay numbers: an int or float is written as the csv
module writes it (a loss of -0.5, ``nan``, ``-inf``), and so is text that is a plain decimal number (``-0.5``,
``+1e-3``), which a spreadsheet reads as that number and nothing more.

Every CSV the web app serves is written by `csv_lines`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: object) -> object:
    """`value` as a CSV writer should get it: text that a spreadsheet would read as a formula, with a leading
    single quote; anything else unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


class _Echo:
    """A file that hands back what is written to it, so that a csv writer returns each line."""

    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[Iterable[object]]) -> Iterator[str]:
    """Each of `rows` as one line of CSV (the csv module's quoting, ending in CRLF), its cells made safe by
    `csv_cell`: for a streamed download."""
    writer = csv.writer(_Echo())
    for row in rows:
        yield writer.writerow([csv_cell(value) for value in row])
