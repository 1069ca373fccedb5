"""The rows of a JSONL, JSON or CSV file, read by one rule wherever a row stands: the form reads the first ones
(`file_head`), the web worker every one (`records.read_records`). Parquet files are read by `parquet_rows`.

The rule: a row takes at most `MAX_ROW_BYTES` (1 MiB) of the file and nests at most `MAX_DEPTH` levels. A
longer or deeper row is a `BadRow` with its line, never held whole in memory nor handed to a recursive parser,
and the rows after it are read as usual. A row of 1 MiB holds more than 65,536 tokens (the longest ``seq_len``
a trial may have) under any tokenizer of fewer than 16 bytes a token, so no row a trial could train on is lost.

Why each format is read as it is: row-level errors with line numbers need a reader that goes row by row,
because a columnar reader (pyarrow's JSON and CSV readers, and the ``datasets`` and pandas loaders built on
them) refuses a whole file for one bad line or one mistyped value.

- JSONL (``.jsonl``, ``.ndjson``, and a ``.json`` file whose first non-space character is not ``[``): line
  by line, each line's bytes decoded here, so invalid UTF-8 makes a bad line and the rest of the file still
  reads. A line over the limit is read to its end without being kept.
- CSV: the same lines go to Python's `csv` module, line endings kept (as with ``newline=""``), so a quoted
  field spanning lines reads whole; a record's line is the one where it starts, and its lines count
  together against the limit. A record over the limit is read past without being kept: to the end of its
  line, or when it has gone on from an earlier line (inside a quoted field), to the line that closes the
  field. The header is a row like the others, and a file whose header is bad has no columns at all
  (`RecordsError`).
- JSON array: element by element. A scanner that knows strings and brackets (`_ValueEnd`) finds where each
  element ends, reading the file in pieces, and only then is the element decoded; an element that is not
  valid JSON is a bad row too. An array that is not closed, or has something other than a comma between
  elements, is refused whole (`RecordsError`), since no element after that point can be found.

A row is a ``(line, value)`` pair, or a `BadRow` saying why it is none.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from webapp.datasets.layouts import RecordsError

MAX_ROW_BYTES = 1 << 20
MAX_DEPTH = 100
READ_BYTES = 1 << 18  # a JSON array is decoded in pieces of this many bytes

# Python's csv module refuses a field over 131,072 characters by default: rows are held to MAX_ROW_BYTES
# instead, the same as in every other format. The limit is per process; a larger one only admits more.
csv.field_size_limit(max(csv.field_size_limit(), MAX_ROW_BYTES))


@dataclass(frozen=True)
class BadRow:
    line: int  # 1-based line (JSONL, CSV: where the row starts) or row number (JSON array, Parquet)
    reason: str  # e.g. "missing role in message 2", "invalid UTF-8 at byte 17"


Item = tuple[int, object] | BadRow  # a row as read (a JSON value or a dict of column values), or why it is none


def too_long(size: int | None) -> str:
    """The reason of a row over `MAX_ROW_BYTES` (`size`: its bytes, when they were counted to its end)."""
    if size is None:
        return f"the row takes more than {MAX_ROW_BYTES:,} bytes (1 MiB), the most a row may take"
    return f"the row takes {size:,} bytes; a row may take at most {MAX_ROW_BYTES:,} bytes (1 MiB)"


TOO_DEEP = f"the row nests deeper than {MAX_DEPTH} levels"


def text_rows(file: BinaryIO, *, suffix: str) -> Iterator[Item]:
    """The rows of `file`, read from its start in the format its `suffix` says (``.csv``; ``.json`` as an array
    when it starts with ``[``; JSONL otherwise). Raises RecordsError (while iterating) for a CSV file whose
    header is bad, and for a JSON array that is not closed or not separated by commas."""
    array = suffix == ".json" and first_char(file) == b"["
    file.seek(0)
    if suffix == ".csv":
        return _csv_rows(file)
    return _json_array_rows(file) if array else _jsonl_rows(file)


class _RowTooLong(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(too_long(size))


class _Lines:
    """The lines of a binary file decoded as UTF-8 (line endings kept, a leading byte-order mark dropped), for
    a reader that takes lines as they come. `number` is the 1-based number of the last line given.

    The lines given since `row_start` may take `MAX_ROW_BYTES` together: the line that goes over is read to
    its end without being kept, and raises _RowTooLong. A line that is not valid UTF-8 is noted in `invalid`
    under its number (the reason names the 1-based byte within the line) and decoded with replacement
    characters, so that a CSV reader stays in step."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.number = 0
        self.row_bytes = 0
        self.last_quotes = 0  # the quotes of the last line read past (`_rest_of_line`)
        self.invalid: dict[int, str] = {}

    def row_start(self) -> None:
        self.row_bytes = 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self.file.readline(MAX_ROW_BYTES + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        self.row_bytes += len(raw)
        if self.row_bytes > MAX_ROW_BYTES:
            whole = len(raw) == self.row_bytes  # the row is this one line: its size is known once it is read
            self.row_bytes += self._rest_of_line(raw)[0] - len(raw)
            raise _RowTooLong(self.row_bytes if whole else None)
        skipped = len(codecs.BOM_UTF8) if self.number == 1 and raw.startswith(codecs.BOM_UTF8) else 0
        try:
            return raw[skipped:].decode("utf-8")
        except UnicodeDecodeError as error:
            self.invalid[self.number] = f"invalid UTF-8 at byte {skipped + error.start + 1}"
            return raw[skipped:].decode("utf-8", errors="replace")

    def skip_quoted(self) -> None:
        """Read past the lines of a CSV field left open by the last line given (an over-long record that began
        on an earlier line: the csv module goes on to the next line only inside a quoted field), up to the line
        whose quotes close it. A quote inside a quoted field is doubled, so the field ends on the first line
        with an odd number of them."""
        quotes = self.last_quotes
        while quotes % 2 == 0:
            raw = self.file.readline(READ_BYTES)
            if not raw:
                return
            self.number += 1
            _, quotes = self._rest_of_line(raw)

    def _rest_of_line(self, raw: bytes) -> tuple[int, int]:
        """Read on to the end of the line that `raw` begins, keeping none of it: the line's bytes and quotes
        (also kept as `last_quotes`)."""
        size, quotes = len(raw), raw.count(b'"')
        while not raw.endswith(b"\n"):
            raw = self.file.readline(READ_BYTES)
            if not raw:
                break
            size, quotes = size + len(raw), quotes + raw.count(b'"')
        self.last_quotes = quotes
        return size, quotes


def _jsonl_rows(file: BinaryIO) -> Iterator[Item]:
    lines = _Lines(file)
    while True:
        lines.row_start()
        try:
            line = next(lines)
        except StopIteration:
            return
        except _RowTooLong as error:
            yield BadRow(lines.number, str(error))
            continue
        if lines.number in lines.invalid:
            yield BadRow(lines.number, lines.invalid[lines.number])
        elif line.strip():
            yield _json_row(lines.number, line)


def _json_row(number: int, text: str) -> Item:
    """The JSON value `text` holds, or why it is no row: nested too deep, or not valid JSON."""
    # Brackets inside strings count here too, so a row under the bound on this count is under the depth bound.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        scan = _ValueEnd()
        scan.scan(text, len(text) - len(text.lstrip()))
        if scan.deepest > MAX_DEPTH:
            return BadRow(number, TOO_DEEP)
    try:
        return number, json.loads(text)
    except json.JSONDecodeError as error:
        return BadRow(number, f"not valid JSON: {error.msg} at column {error.colno}")


def csv_header(file: BinaryIO) -> list[str]:
    """The column names of a CSV file: its first record that is not blank, read by the rule of every row.
    Raises RecordsError when the header cannot be read or there is none."""
    lines = _Lines(file)
    return _header(csv.reader(lines), lines)


def _header(reader: Iterator[list[str]], lines: _Lines) -> list[str]:
    while True:
        lines.row_start()
        try:
            fields = next(reader)
        except StopIteration:
            raise RecordsError("no rows: the file has no header line") from None
        except (csv.Error, _RowTooLong) as error:
            raise RecordsError(f"the header (line {lines.number}) cannot be read: {_csv_reason(error)}") from None
        if fields:
            if lines.invalid:
                broken = min(lines.invalid)
                raise RecordsError(f"the header (line {broken}) cannot be read: {lines.invalid[broken]}")
            return [name.strip() for name in fields]


def _csv_reason(error: Exception) -> str:
    return f"not valid CSV: {error}" if isinstance(error, csv.Error) else str(error)


def _csv_rows(file: BinaryIO) -> Iterator[Item]:
    lines = _Lines(file)
    reader = csv.reader(lines)
    header = _header(reader, lines)
    start = lines.number + 1  # the line where the next record starts
    while True:
        lines.row_start()
        try:
            fields = next(reader)
        except StopIteration:
            return
        except (csv.Error, _RowTooLong) as error:
            yield BadRow(start, _csv_reason(error))
            if isinstance(error, _RowTooLong) and lines.number > start:
                lines.skip_quoted()
            start = lines.number + 1
            continue
        numbers, start = range(start, lines.number + 1), lines.number + 1
        if not fields:  # a blank line
            continue
        if broken := next((number for number in numbers if number in lines.invalid), None):
            where = "" if broken == numbers.start else f" (line {broken})"
            yield BadRow(numbers.start, lines.invalid[broken] + where)
        elif len(fields) != len(header):
            yield BadRow(numbers.start, f"{len(fields)} fields, the header has {len(header)}")
        else:
            yield numbers.start, dict(zip(header, fields, strict=True))


def first_char(file: BinaryIO) -> bytes:
    """The first byte of `file` that is not white space (nor a byte-order mark); b"" for none. Reads from its
    start, and leaves it wherever it stopped."""
    file.seek(0)
    chunk = file.read(READ_BYTES).removeprefix(codecs.BOM_UTF8)
    while chunk:
        if stripped := chunk.lstrip():
            return stripped[:1]
        chunk = file.read(READ_BYTES)
    return b""


_IN_STRING = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)  # a string's characters up to its closing quote
_OUTSIDE = re.compile(r'"|[\[{]+|[\]}]+|[^"\[\]{}]+')  # a quote, a run of openers or closers, anything else
_SPACE = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()


class _ValueEnd:
    """Finds where the JSON value that starts a text ends, in text that may arrive in pieces, without keeping
    what it has passed and without recursion: it follows strings (and their escapes) and counts brackets.
    `deepest` is the deepest nesting seen. It finds the end of any value that is well bracketed, valid JSON
    or not, so that an element that is not valid JSON is one bad row."""

    def __init__(self) -> None:
        self.depth = 0
        self.deepest = 0
        self.in_string = False
        self.escaped = False  # a piece ended inside a string just after a backslash

    def scan(self, text: str, pos: int) -> int | None:
        """Scan `text` from `pos`, going on from the pieces scanned before: the index just past the value's
        end, or None when `text` ends first (the next piece continues where this one stopped)."""
        end = len(text)
        while pos < end:
            if self.in_string:
                if self.escaped:
                    pos, self.escaped = pos + 1, False
                    continue
                pos = _IN_STRING.match(text, pos).end()  # type: ignore[union-attr]  # it matches the empty string
                if pos == end:
                    return None
                if text[pos] == "\\":  # a backslash that ends the piece: the character it escapes comes next
                    pos, self.escaped = pos + 1, True
                    continue
                pos, self.in_string = pos + 1, False  # the closing quote
                if self.depth == 0:
                    return pos
                continue
            match = _OUTSIDE.match(text, pos)
            assert match is not None  # the alternatives cover every character
            token, pos = match.group(), match.end()
            if token == '"':
                self.in_string = True
            elif token[0] in "[{":
                self.depth += len(token)
                self.deepest = max(self.deepest, self.depth)
            elif token[0] in "]}":
                if self.depth == 0:  # a scalar value ended just before this closer
                    return match.start()
                if len(token) >= self.depth:
                    return match.start() + self.depth
                self.depth -= len(token)
            elif self.depth == 0 and (comma := token.find(",")) >= 0:  # a scalar value ends at a comma
                return match.start() + comma
        return None


class _Window:
    """A file's text, decoded from UTF-8 in pieces as it is needed (a leading byte-order mark dropped), and the
    position reached in it. What lies before the position is dropped by `compact`, between rows."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.read_bytes = 0

    def more(self) -> bool:
        """Decode the next piece of the file onto the text; False at the end of the file."""
        chunk = self.file.read(READ_BYTES)
        if self.read_bytes == 0:
            chunk = chunk.removeprefix(codecs.BOM_UTF8)
        pending = len(self.decoder.getstate()[0])  # bytes of a character cut by the last piece
        try:
            self.text += self.decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as error:
            raise RecordsError(f"invalid UTF-8 at byte {self.read_bytes - pending + error.start + 1}") from None
        self.read_bytes += len(chunk)
        return bool(chunk)

    def compact(self) -> None:
        if self.pos > READ_BYTES:
            self.text, self.pos = self.text[self.pos:], 0

    def skip_space(self) -> str | None:
        """The next character that is not white space (not consumed), or None at the end of the file."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]  # matches ""
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return None


def _json_array_rows(file: BinaryIO) -> Iterator[Item]:
    window = _Window(file)
    window.skip_space()
    window.pos += 1  # the opening bracket, which `text_rows` found
    number = 0
    while True:
        window.compact()
        next_char = window.skip_space()
        if next_char == "]":
            window.pos += 1
            break
        if number:
            if next_char != ",":
                found = "the file ends" if next_char is None else f"{next_char!r} comes"
                raise RecordsError(f"not valid JSON: {found} after row {number}, where ',' or ']' should")
            window.pos += 1
            next_char = window.skip_space()
        if next_char is None:
            raise RecordsError(f"not valid JSON: the file ends inside the array, after row {number}")
        number += 1
        yield _array_element(window, number)
    if window.skip_space() is not None:
        raise RecordsError(f"not valid JSON: text after the array's closing bracket (after row {number})")


def _array_element(window: _Window, number: int) -> Item:
    start = window.pos
    try:  # most elements lie whole in the text already read, and decode at C speed
        value, end = _DECODER.raw_decode(window.text, start)
    except (json.JSONDecodeError, RecursionError):
        end = len(window.text)
    if end < len(window.text):  # something follows: a number cut at the end of the text was not whole
        window.pos = end
        if end - start > MAX_ROW_BYTES // 4 and (size := len(window.text[start:end].encode("utf-8"))) > MAX_ROW_BYTES:
            return BadRow(number, too_long(size))
        if window.text.count("[", start, end) + window.text.count("{", start, end) > MAX_DEPTH:
            scan = _ValueEnd()
            scan.scan(window.text[start:end], 0)
            if scan.deepest > MAX_DEPTH:
                return BadRow(number, TOO_DEEP)
        return number, value
    return _scanned_element(window, number)


def _scanned_element(window: _Window, number: int) -> Item:
    """The element at the window's position, found by the scanner: one not yet read whole, too long, too deep to
    decode, or not valid JSON."""
    start, scan = window.pos, _ValueEnd()
    at = start
    while (end := scan.scan(window.text, at)) is None:
        at = len(window.text)
        if at - start > MAX_ROW_BYTES:
            return _skip_element(window, scan, number, start=start)
        if not window.more():
            raise RecordsError(f"not valid JSON: the file ends inside row {number}")
    window.pos = end
    text = window.text[start:end]
    if len(text) > MAX_ROW_BYTES // 4 and (size := len(text.encode("utf-8"))) > MAX_ROW_BYTES:
        return BadRow(number, too_long(size))
    if scan.deepest > MAX_DEPTH:
        return BadRow(number, TOO_DEEP)
    try:
        return number, json.loads(text)
    except json.JSONDecodeError as error:
        return BadRow(number, f"not valid JSON: {error.msg} at character {error.pos + 1} of the row")


def _skip_element(window: _Window, scan: _ValueEnd, number: int, *, start: int) -> BadRow:
    """Read on to the end of an element already over the limit, keeping none of it; the row's reason."""
    size = len(window.text[start:].encode("utf-8"))
    while True:
        window.text, window.pos = "", 0
        if not window.more():
            raise RecordsError(f"not valid JSON: the file ends inside row {number}")
        end = scan.scan(window.text, 0)
        if end is not None:
            window.pos = end
            return BadRow(number, too_long(size + len(window.text[:end].encode("utf-8"))))
        size += len(window.text.encode("utf-8"))
