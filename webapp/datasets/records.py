"""Read instruction and chat data files into normalized examples, every bad row counted by its line.

A file holds rows of one `Kind`, whose roles are read from the columns its `Layout` names (`layouts`).
`read_records` turns each row into an `Example` (plain text, a conversation of ``{"role", "content"}``
messages whose roles are in `ROLES`, or a preference pair: a prompt's messages and two answers'), or into a
`BadRow` saying where and why (`record_rows` holds the per-row rules, `file_rows` and `parquet_rows` the rules
of each format and the limits of a row). A bad row never
stops the read. A file with no usable row, columns that fit no kind or not the one given, or an unsupported
format raises `RecordsError`.

The first `BAD_ROWS_KEPT` bad rows are kept in `Records.bad`, and all are counted: a file of small bad rows (a
JSON array of 25 million numbers fits an upload) would otherwise take gigabytes for their reasons alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from webapp.datasets.file_rows import BadRow, Item, text_rows
from webapp.datasets.layouts import Kind, Layout, RecordsError, layout_for
from webapp.datasets.parquet_rows import parquet_columns, parquet_rows
from webapp.datasets.record_rows import (
    ROLES,
    BadValue,
    alpaca_messages,
    chat_messages,
    described,
    preference_messages,
    prompt_completion_messages,
    text_value,
)

__all__ = ["BAD_ROWS_KEPT", "ROLES", "SUFFIXES", "BadRow", "Example", "Kind", "Layout", "Records", "RecordsError",
           "read_records"]

SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")
BAD_ROWS_KEPT = 1_000


@dataclass(frozen=True)
class Example:
    line: int  # 1-based line (JSONL, CSV: where the row starts) or row number (JSON array, Parquet)
    text: str | None  # Kind.TEXT only
    messages: tuple[dict[str, str], ...]  # other kinds: ({"role": ..., "content": ...}, ...), roles in ROLES;
    # Kind.PREFERENCE: the prompt shared by its two answers
    chosen: tuple[dict[str, str], ...] = ()  # Kind.PREFERENCE only: the answers' messages
    rejected: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class Records:
    layout: Layout
    examples: list[Example]
    bad: list[BadRow]  # the first `BAD_ROWS_KEPT` bad rows, in file order
    rows: int  # rows read, good + bad (blank lines and a CSV header are not rows)

    @property
    def kind(self) -> Kind:
        return self.layout.kind

    @property
    def n_bad(self) -> int:
        return self.rows - len(self.examples)


def read_records(path: Path, *, kind: Kind | None = None, columns: Mapping[str, str] | None = None,
                 max_decoded_bytes: int) -> Records:
    """Every row of `path` as an `Example` or a `BadRow`. The format follows the suffix (`SUFFIXES`). The
    layout is `layouts.layout_for` of the first row that is an object (a CSV file's header, a Parquet file's
    schema) with `kind` and the `columns` given; `max_decoded_bytes` bounds what a Parquet file may decode to.

    Raises RecordsError for an unsupported suffix, columns that fit no kind or not `kind`, a file with no usable
    row, and what `file_rows` and `parquet_rows` refuse whole.
    """
    suffix = path.suffix.lower()
    given = dict(columns or {})
    try:
        if suffix == ".parquet":
            layout = layout_for(parquet_columns(str(path)), kind=kind, given=given)
            items = parquet_rows(str(path), list(layout.columns.values()), max_decoded_bytes=max_decoded_bytes)
            return _collect(items, layout=layout, kind=kind, given=given, fixed=True)
        if suffix not in SUFFIXES:
            raise RecordsError(f"unsupported format {suffix or '(no suffix)'!r}; use {', '.join(SUFFIXES)}")
        with path.open("rb") as file:  # every CSV row has the header's columns; a JSON row may have others
            return _collect(text_rows(file, suffix=suffix), layout=None, kind=kind, given=given,
                            fixed=suffix == ".csv")
    except RecordsError as error:
        raise RecordsError(f"{path.name}: {error}") from None


def _collect(items: Iterator[Item], *, layout: Layout | None, kind: Kind | None, given: Mapping[str, str],
             fixed: bool) -> Records:
    # The layout of a JSON file is settled at its first row that is an object, so bad lines before it count.
    examples: list[Example] = []
    bad: list[BadRow] = []
    n_bad = 0
    for item in items:
        if not isinstance(item, BadRow):
            line, row = item
            if not isinstance(row, dict):
                item = BadRow(line, f"row is {described(row)}, not an object")
            else:
                if layout is None:
                    layout = layout_for(list(row), kind=kind, given=given, fixed=fixed)
                try:
                    examples.append(_example(line, row, layout))
                    continue
                except BadValue as error:
                    item = BadRow(line, str(error))
        n_bad += 1
        if len(bad) < BAD_ROWS_KEPT:
            bad.append(item)
    if layout is None or not examples:
        if not bad:
            raise RecordsError("no rows")
        raise RecordsError(f"no usable row: {n_bad} rows, all bad; first: line {bad[0].line}: {bad[0].reason}")
    return Records(layout=layout, examples=examples, bad=bad, rows=len(examples) + n_bad)


def _example(line: int, row: dict[str, object], layout: Layout) -> Example:
    kind, columns = layout.kind, layout.columns
    if kind is Kind.TEXT:
        return Example(line=line, text=text_value(row, columns), messages=())
    if kind is Kind.MESSAGES:
        return Example(line=line, text=None, messages=chat_messages(row, columns["messages"]))
    if kind is Kind.PREFERENCE:
        prompt, chosen, rejected = preference_messages(row, columns)
        return Example(line=line, text=None, messages=prompt, chosen=chosen, rejected=rejected)
    if kind is Kind.ALPACA:
        return Example(line=line, text=None, messages=alpaca_messages(row, columns))
    return Example(line=line, text=None, messages=prompt_completion_messages(row, columns))
