"""The kind of an instruction or chat data file, from its head: cheap enough for the upload form.

The web worker reads the whole file (`records.read_records`) and counts every bad row; the form only refuses a
file that holds no instruction data at all (columns of no known kind, or not those of the kind chosen) before it
is stored. It finds the columns where `read_records` settles the kind: the first JSON object of a JSONL file,
the first object in a JSON array, a CSV file's header, a Parquet file's schema. Only the first `HEAD_BYTES`
of a text format are read; a head that holds no object is refused, saying so.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from webapp.datasets.records import Kind, RecordsError, checked_kind

HEAD_BYTES = 1 << 20


def file_kind(file: BinaryIO, *, suffix: str, kind: Kind | None) -> Kind:
    """The kind of the rows of `file` (a ``records.SUFFIXES`` format, told by `suffix`): `kind` when its
    columns are there, else RecordsError; with `kind` None, the kind its columns make. Leaves `file` rewound."""
    try:
        if suffix == ".parquet":
            return checked_kind(kind, _parquet_columns(file))
        file.seek(0)
        head = file.read(HEAD_BYTES).removeprefix(codecs.BOM_UTF8)
        if not head.strip():
            raise RecordsError("the file is empty")
        if suffix == ".csv":
            return checked_kind(kind, _csv_header(head))
        if suffix == ".json" and head.lstrip()[:1] == b"[":
            return checked_kind(kind, _first_array_object(head))
        return checked_kind(kind, _first_line_object(head))
    finally:
        file.seek(0)


def _parquet_columns(file: BinaryIO) -> list[str]:
    try:
        return list(pq.ParquetFile(file).schema_arrow.names)
    except pa.ArrowException as error:
        raise RecordsError(f"not a readable Parquet file: {error}") from error


def _csv_header(head: bytes) -> list[str]:
    text = head.decode("utf-8", errors="replace")
    for fields in csv.reader(io.StringIO(text, newline="")):
        if fields:
            return [name.strip() for name in fields]
    raise RecordsError("no rows: the file has no header line")


def _first_line_object(head: bytes) -> list[str]:
    lines = head.splitlines()
    if len(head) == HEAD_BYTES and lines:
        lines.pop()  # cut off by the head: it may be a whole object's beginning
    for raw in lines:
        try:
            row = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(row, dict):
            return list(row)
    raise RecordsError(f"no JSON object on a line of its own in the first {HEAD_BYTES:,} bytes; JSONL has one "
                       "object per line")


def _first_array_object(head: bytes) -> list[str]:
    text = head.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            break
        try:
            row, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError as error:
            if len(head) < HEAD_BYTES:
                raise RecordsError(f"not valid JSON: {error}") from error
            break
        if isinstance(row, dict):
            return list(row)
    raise RecordsError(f"no JSON object in the array's first {HEAD_BYTES:,} bytes")
