"""The layout of an instruction or chat data file, from its first rows: cheap enough for the upload form.

The web worker reads the whole file (`records.read_records`) and counts every bad row; the form only refuses a
file that holds no instruction data at all (columns that fit no kind, or not the kind chosen or the columns
named) before it is stored. It finds the columns where `read_records` settles the layout, read by the same
rules (`file_rows`): a CSV file's header, the first row of a JSON file that is an object (bad rows before it,
too long or not JSON, are read past, up to `HEAD_ROWS` rows or `HEAD_BYTES` of the file), a Parquet file's
schema, whose decode bounds are checked here too (`parquet_rows.decode_plan`), so that a file that could never
be read is refused before it is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import BinaryIO

from webapp.datasets.file_rows import BadRow, csv_header, first_char, text_rows
from webapp.datasets.layouts import Kind, Layout, RecordsError, layout_for
from webapp.datasets.parquet_rows import decode_plan, parquet_columns
from webapp.datasets.record_rows import described

HEAD_ROWS = 1_000  # rows read past, at most, before the first object: the request must stay short
HEAD_BYTES = 64 << 20


def file_layout(file: BinaryIO, *, suffix: str, kind: Kind | None, given: Mapping[str, str],
                max_decoded_bytes: int) -> Layout:
    """The layout of the rows of `file` (a ``records.SUFFIXES`` format, told by `suffix`) with `kind` and the
    columns `given` (`layouts.layout_for`). Raises RecordsError (LayoutError for the columns given) when there
    is none, and for a Parquet file over the decode bounds. Leaves `file` rewound."""
    try:
        if suffix == ".parquet":
            layout = layout_for(parquet_columns(file), kind=kind, given=given)
            decode_plan(file, list(layout.columns.values()), max_decoded_bytes=max_decoded_bytes)
            return layout
        if first_char(file) == b"":
            raise RecordsError("the file is empty")
        file.seek(0)
        if suffix == ".csv":
            return layout_for(csv_header(file), kind=kind, given=given)
        return layout_for(_first_object_keys(file, suffix=suffix), kind=kind, given=given, fixed=False)
    finally:
        file.seek(0)


def _first_object_keys(file: BinaryIO, *, suffix: str) -> list[str]:
    first_bad: BadRow | None = None
    where = "in the file"
    for count, item in enumerate(text_rows(file, suffix=suffix), 1):
        if not isinstance(item, BadRow) and isinstance(item[1], dict):
            return list(item[1])
        first_bad = first_bad or (item if isinstance(item, BadRow) else
                                  BadRow(item[0], f"row is {described(item[1])}, not an object"))
        if count >= HEAD_ROWS or file.tell() > HEAD_BYTES:
            where = f"among the first {count:,} rows"
            break
    first = f"; line {first_bad.line}: {first_bad.reason}" if first_bad else ""
    raise RecordsError(f"no row is a JSON object {where}{first}. JSONL has one object a line, a JSON file an array "
                       "of objects")
