"""Read instruction and chat data files into normalized examples, every bad row counted by its line.

A file holds rows of one `Kind`, told apart by its columns (`detect_kind`). `read_records` turns each row
into an `Example` (plain text, or a conversation of ``{"role", "content"}`` messages whose roles are in
`ROLES`), or into a `BadRow` saying where and why (`record_rows` holds the per-row rules). A bad row never
stops the read. A file with no usable row, columns of no known kind, a kind that does not match the
columns, or an unsupported format raises `RecordsError`.

How each format is read, and why: row-level errors with line numbers need a line-oriented reader for the
text formats, because a columnar reader (pyarrow's JSON and CSV readers, and the ``datasets`` and pandas
loaders built on such readers) refuses a whole file for one bad line or one mistyped value.

- JSONL (``.jsonl``, ``.ndjson``, and a ``.json`` file whose first non-space character is not ``[``)
  streams line by line. Each line's bytes are decoded here, so invalid UTF-8 makes a bad line and the rest
  of the file still reads.
- CSV streams the same way into Python's `csv` module, line endings kept (as with ``newline=""``), so a
  quoted field spanning lines reads whole; a row's line is the one where it starts. A field longer than the
  `csv` module's limit (131,072 characters) makes a bad row.
- A JSON array is loaded whole, so it alone is refused above `max_bytes`, with a message suggesting JSONL;
  the streaming formats hold one line or one batch at a time and need no such cap.
- Parquet streams by record batches (``ParquetFile.iter_batches``), reading only the kind's columns. Its
  columns are typed, so a bad row there is a null or an empty value; its line is its 1-based row number.

Every bad row is kept in `Records.bad`, uncapped: the examples themselves already take memory in
proportion to the file.
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from webapp.datasets.record_rows import (
    ROLES,
    BadValue,
    alpaca_messages,
    chat_messages,
    described,
    nonempty_string,
    prompt_completion_messages,
)

__all__ = ["ROLES", "BadRow", "Example", "Kind", "Records", "RecordsError", "checked_kind", "detect_kind",
           "read_records"]

SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")
PARQUET_BATCH_ROWS = 1_024
LISTED_COLUMNS, LISTED_COLUMN_CHARS = 20, 60  # of a file's columns, what an error names


class Kind(StrEnum):
    TEXT = "text"  # a `text` column: plain text, every token trained
    PROMPT_COMPLETION = "prompt_completion"  # `prompt` + `completion` columns
    ALPACA = "alpaca"  # `instruction`, optional `input`, `output`
    MESSAGES = "messages"  # `messages`: [{role, content}] (OpenAI), or `conversations`: [{from, value}] (ShareGPT)


# The columns that make each kind, in detection priority: a kind is found when all of one group are present.
KIND_COLUMNS: dict[Kind, tuple[tuple[str, ...], ...]] = {
    Kind.MESSAGES: (("messages",), ("conversations",)),
    Kind.ALPACA: (("instruction", "output"),),
    Kind.PROMPT_COMPLETION: (("prompt", "completion"),),
    Kind.TEXT: (("text",),),
}
OPTIONAL_COLUMNS: dict[Kind, tuple[str, ...]] = {Kind.ALPACA: ("input",)}


class RecordsError(ValueError):
    """A file that cannot be read into examples at all; the message says why and what is accepted."""


@dataclass(frozen=True)
class Example:
    line: int  # 1-based line (JSONL, CSV: where the row starts) or row number (JSON array, Parquet)
    text: str | None  # Kind.TEXT only
    messages: tuple[dict[str, str], ...]  # other kinds: ({"role": ..., "content": ...}, ...), roles in ROLES


@dataclass(frozen=True)
class BadRow:
    line: int  # as in Example
    reason: str  # e.g. "missing role in message 2", "invalid UTF-8 at byte 17"


@dataclass(frozen=True)
class Records:
    kind: Kind
    examples: list[Example]
    bad: list[BadRow]  # every bad row, in file order
    rows: int  # rows read, good + bad (blank lines and a CSV header are not rows)


def detect_kind(columns: Collection[str]) -> Kind:
    """The kind of rows with these columns (the first good row's keys for JSON, the header for CSV, the
    schema for Parquet), by priority: messages or conversations, then instruction + output, then prompt +
    completion, then text. Raises RecordsError when no kind's columns are all present."""
    for kind, groups in KIND_COLUMNS.items():
        if any(set(group) <= set(columns) for group in groups):
            return kind
    accepted = "; ".join(f"{kind}: {_needed(kind)}" for kind in KIND_COLUMNS)
    raise RecordsError(f"no known columns: found {_listed(columns)}; accepted: {accepted}")


def read_records(path: Path, *, kind: Kind | None = None, max_bytes: int | None = None) -> Records:
    """Every row of `path` as an `Example` or a `BadRow`. The format follows the suffix (`SUFFIXES`). With
    `kind` None the kind is detected from the columns; a given kind must match them. `max_bytes` caps the
    size of a JSON array, the one format read whole.

    Raises RecordsError for an unsupported suffix, unknown or mismatched columns, a JSON array that is too
    large or not valid JSON, an unreadable Parquet file, and a file with no usable row.
    """
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        items = _jsonl_rows(path)
    elif suffix == ".json":
        items = _json_array_rows(path, max_bytes=max_bytes) if _first_char(path) == b"[" else _jsonl_rows(path)
    elif suffix == ".csv":
        items = _csv_rows(path)
    elif suffix == ".parquet":
        items = _parquet_rows(path, kind=kind)
    else:
        raise RecordsError(f"{path.name}: unsupported format {suffix or '(no suffix)'!r}; use {', '.join(SUFFIXES)}")
    return _collect(items, kind=kind, name=path.name)


Item = tuple[int, object] | BadRow  # a row as read (a JSON value or a dict of column values), or why it is none


def _collect(items: Iterator[Item], *, kind: Kind | None, name: str) -> Records:
    # The kind is settled at the first row that is an object, so a JSON file's bad lines before it still count.
    examples: list[Example] = []
    bad: list[BadRow] = []
    settled: tuple[Kind, str] | None = None  # the kind and its messages column
    for item in items:
        if isinstance(item, BadRow):
            bad.append(item)
            continue
        line, row = item
        if not isinstance(row, dict):
            bad.append(BadRow(line, f"row is {described(row)}, not an object"))
            continue
        if settled is None:
            found = checked_kind(kind, row.keys())
            settled = (found, "messages" if "messages" in row else "conversations")
        try:
            examples.append(_example(line, row, kind=settled[0], messages_column=settled[1]))
        except BadValue as error:
            bad.append(BadRow(line, str(error)))
    if settled is None or not examples:
        if not bad:
            raise RecordsError(f"{name}: no rows")
        raise RecordsError(f"{name}: no usable row: {len(bad)} rows, all bad; first: line {bad[0].line}: "
                           f"{bad[0].reason}")
    return Records(kind=settled[0], examples=examples, bad=bad, rows=len(examples) + len(bad))


def _example(line: int, row: dict[str, object], *, kind: Kind, messages_column: str) -> Example:
    if kind is Kind.TEXT:
        return Example(line=line, text=nonempty_string(row, "text"), messages=())
    if kind is Kind.MESSAGES:
        return Example(line=line, text=None, messages=chat_messages(row, messages_column))
    if kind is Kind.ALPACA:
        return Example(line=line, text=None, messages=alpaca_messages(row))
    return Example(line=line, text=None, messages=prompt_completion_messages(row))


def checked_kind(kind: Kind | None, columns: Collection[str]) -> Kind:
    """The kind of rows with these columns: `kind` when they have its columns, else RecordsError; with `kind`
    None, the one `detect_kind` finds."""
    if kind is None:
        return detect_kind(columns)
    if not any(set(group) <= set(columns) for group in KIND_COLUMNS[kind]):
        raise RecordsError(f"kind {kind.value!r} needs {_needed(kind)}; found {_listed(columns)}")
    return kind


def _needed(kind: Kind) -> str:
    needed = " or ".join(" + ".join(group) for group in KIND_COLUMNS[kind])
    optional = OPTIONAL_COLUMNS.get(kind)
    return f"{needed} (optional: {', '.join(optional)})" if optional else needed


def _listed(columns: Collection[str]) -> str:
    """The columns for a message, the first `LISTED_COLUMNS` of them, each cut to `LISTED_COLUMN_CHARS`: a file
    of a hundred thousand columns, or of one a megabyte long, makes an error of a few lines."""
    if not columns:
        return "no columns"
    shown = [repr(c[:LISTED_COLUMN_CHARS] + "…" if len(c) > LISTED_COLUMN_CHARS else c)
             for c in itertools.islice(columns, LISTED_COLUMNS)]
    more = len(columns) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more > 0 else "")


def _decoded_lines(file: BinaryIO, invalid: dict[int, str]) -> Iterator[str]:
    """Each line of `file`, line ending kept, decoded as UTF-8 with a leading byte-order mark dropped. A line
    that is not valid UTF-8 is recorded in `invalid` under its 1-based number (the reason names the 1-based
    byte within the line) and decoded with replacement characters, so a CSV reader stays in step."""
    for number, raw in enumerate(file, 1):
        skipped = len(codecs.BOM_UTF8) if number == 1 and raw.startswith(codecs.BOM_UTF8) else 0
        try:
            line = raw[skipped:].decode("utf-8")
        except UnicodeDecodeError as error:
            invalid[number] = f"invalid UTF-8 at byte {skipped + error.start + 1}"
            line = raw[skipped:].decode("utf-8", errors="replace")
        yield line


def _jsonl_rows(path: Path) -> Iterator[Item]:
    invalid: dict[int, str] = {}
    with path.open("rb") as file:
        for number, line in enumerate(_decoded_lines(file, invalid), 1):
            if number in invalid:
                yield BadRow(number, invalid[number])
            elif line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as error:
                    yield BadRow(number, f"not valid JSON: {error.msg} at column {error.colno}")


def _first_char(path: Path) -> bytes:
    with path.open("rb") as file:
        chunk = file.read(1 << 16).removeprefix(codecs.BOM_UTF8)
        while chunk:
            if stripped := chunk.lstrip():
                return stripped[:1]
            chunk = file.read(1 << 16)
    return b""


def _json_array_rows(path: Path, *, max_bytes: int | None) -> Iterator[Item]:
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise RecordsError(f"{path.name}: a JSON array of {size:,} bytes is over the {max_bytes:,}-byte limit for "
                           "a file read whole; save it as JSONL (one object per line), which is read line by line")
    try:
        rows = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise RecordsError(f"{path.name}: invalid UTF-8 at byte {error.start + 1}") from error
    except json.JSONDecodeError as error:
        raise RecordsError(f"{path.name}: not valid JSON: {error}") from error
    if not isinstance(rows, list):  # valid JSON starting with "[" is an array; this guards the type only
        raise RecordsError(f"{path.name}: not a JSON array")
    yield from enumerate(rows, 1)


def _csv_rows(path: Path) -> Iterator[Item]:
    invalid: dict[int, str] = {}
    header: list[str] | None = None
    with path.open("rb") as file:
        reader = csv.reader(_decoded_lines(file, invalid))
        start = 1  # the line where the next record starts
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                yield BadRow(start, f"not valid CSV: {error}")
                start = reader.line_num + 1
                continue
            lines, start = range(start, reader.line_num + 1), reader.line_num + 1
            if not fields:  # a blank line
                continue
            if header is None:
                header = [name.strip() for name in fields]
            elif broken := next((number for number in lines if number in invalid), None):
                where = "" if broken == lines.start else f" (line {broken})"
                yield BadRow(lines.start, invalid[broken] + where)
            elif len(fields) != len(header):
                yield BadRow(lines.start, f"{len(fields)} fields, the header has {len(header)}")
            else:
                yield lines.start, dict(zip(header, fields, strict=True))


def _parquet_rows(path: Path, *, kind: Kind | None) -> Iterator[Item]:
    try:
        file = pq.ParquetFile(path)
        names = file.schema_arrow.names
        kind = checked_kind(kind, names)
        wanted = {column for group in KIND_COLUMNS[kind] for column in group} | set(OPTIONAL_COLUMNS.get(kind, ()))
        batches = file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[c for c in names if c in wanted])
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except pa.ArrowException as error:
        raise RecordsError(f"{path.name}: not a readable Parquet file: {error}") from error
