"""The rows of a Parquet file, read within bounds that are known before anything is decoded.

A Parquet file is compressed, so its size says little about what it decodes to: 50 KiB of zstd can hold
1.5 GiB of one repeated string. Its metadata gives the uncompressed size of every column chunk, and these
bounds are checked on them before a value is read (`decode_plan`):

- the columns read may decode to `max_decoded_bytes` in all (``HYDRA_MAX_DECODED_MB``), else the file is
  refused (`RecordsError`);
- a row group whose rows decode to more than `MAX_ROW_BYTES` each on average holds a row over the limit of a
  row: which one cannot be known without decoding it, so none of its rows is decoded, each is a bad row;
- rows are decoded in batches of at most `BATCH_BYTES` by those averages, and `BATCH_ROWS` rows.

Once decoded, a row whose strings take more than `MAX_ROW_BYTES` in UTF-8 is a bad row, as in every other
format, and the rows read so far may take `max_decoded_bytes` in all: the metadata gives sizes as stored, and a
dictionary-encoded value is stored once however many rows repeat it. Between what the metadata says and what is
counted there, the memory limit of the web worker's tasks is what holds (a batch of dictionary-encoded values,
a file whose metadata lies; docs/security.md). Parquet itself refuses a schema nested deeper than 100 levels.
A row's line is its 1-based row number. Only the columns a layout reads are decoded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from webapp.datasets.file_rows import MAX_ROW_BYTES, BadRow, Item, too_long
from webapp.datasets.layouts import RecordsError, listed

BATCH_BYTES = 64 << 20
BATCH_ROWS = 1_024


@dataclass(frozen=True)
class RowGroup:
    index: int
    first_row: int  # the 1-based number of its first row
    rows: int
    decoded_bytes: int  # of the columns read, by the metadata

    @property
    def too_large(self) -> bool:
        return self.decoded_bytes > self.rows * MAX_ROW_BYTES


def parquet_columns(file: BinaryIO | str) -> list[str]:
    """The column names of a Parquet file's schema. Raises RecordsError for a file Parquet cannot read."""
    with _readable():
        return list(pq.ParquetFile(file).schema_arrow.names)


def decode_plan(file: BinaryIO | str, columns: Sequence[str], *, max_decoded_bytes: int) -> list[RowGroup]:
    """The row groups of the file, with what `columns` decode to in each, by the metadata. Raises RecordsError
    when they decode to more than `max_decoded_bytes` in all, and when every row group is over the limit of a
    row (no row could be read)."""
    with _readable():
        parquet = pq.ParquetFile(file)
        return _plan(parquet, columns, max_decoded_bytes=max_decoded_bytes)


def parquet_rows(path: str, columns: Sequence[str], *, max_decoded_bytes: int) -> Iterator[Item]:
    """Every row of the file at `path` as ``(number, {column: value})``, or a `BadRow`, `columns` only, within
    the bounds of `decode_plan` (whose RecordsError it raises, before any row)."""
    with _readable():
        parquet = pq.ParquetFile(path)
        plan = _plan(parquet, columns, max_decoded_bytes=max_decoded_bytes)
    decoded = 0  # what the rows read so far decode to: a dictionary-encoded value decodes once per row
    for group in plan:
        if group.too_large:
            last = group.first_row + group.rows - 1
            reason = (f"its row group (rows {group.first_row:,} to {last:,}) decodes to {group.decoded_bytes:,} "
                      f"bytes, more than {MAX_ROW_BYTES:,} a row: not read")
            yield from (BadRow(group.first_row + k, reason) for k in range(group.rows))
            continue
        batch_rows = max(1, min(BATCH_ROWS, BATCH_BYTES * group.rows // max(group.decoded_bytes, 1)))
        number = group.first_row
        with _readable():
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group.index], columns=list(columns)):
                for row in batch.to_pylist():
                    size = sum(_value_bytes(value) for value in row.values())
                    decoded += size
                    if decoded > max_decoded_bytes:
                        raise RecordsError(
                            f"its columns {listed(columns)} decode to more than {max_decoded_bytes:,} bytes, the "
                            f"limit for one file (HYDRA_MAX_DECODED_MB), by row {number:,}; split the file")
                    yield (number, row) if size <= MAX_ROW_BYTES else BadRow(number, too_long(size))
                    number += 1


def _plan(parquet: pq.ParquetFile, columns: Sequence[str], *, max_decoded_bytes: int) -> list[RowGroup]:
    meta = parquet.metadata
    names, wanted = set(parquet.schema_arrow.names), set(columns)
    leaves = [j for j in range(meta.num_columns) if _top_name(meta.schema.column(j).path, names) in wanted]
    plan, first = [], 1
    for index in range(meta.num_row_groups):
        group = meta.row_group(index)
        decoded = sum(group.column(j).total_uncompressed_size for j in leaves)
        plan.append(RowGroup(index=index, first_row=first, rows=group.num_rows, decoded_bytes=decoded))
        first += group.num_rows
    total = sum(group.decoded_bytes for group in plan)
    if total > max_decoded_bytes:
        raise RecordsError(
            f"its columns {listed(columns)} decode to {total:,} bytes (the file's metadata says), over the limit "
            f"of {max_decoded_bytes:,} bytes for one file (HYDRA_MAX_DECODED_MB); split the file")
    if plan and all(group.too_large for group in plan if group.rows):
        largest = max(plan, key=lambda group: group.decoded_bytes)
        raise RecordsError(
            f"no row can be read: every row group decodes to more than {MAX_ROW_BYTES:,} bytes a row, the most a "
            f"row may take (row group {largest.index + 1}: {largest.decoded_bytes:,} bytes for {largest.rows:,} "
            "rows)")
    return plan


def _top_name(path: str, names: set[str]) -> str:
    """The column a leaf's dotted path belongs to: the longest of `names` the path is or starts with (a column's
    own name may hold dots)."""
    parts = path.split(".")
    return next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in names), path)


def _value_bytes(value: object) -> int:
    """The UTF-8 bytes of the strings in a decoded value (nested no deeper than Parquet's 100 levels)."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(_value_bytes(item) for item in value.values())
    if isinstance(value, list):
        return sum(_value_bytes(item) for item in value)
    return 0


@contextmanager
def _readable() -> Iterator[None]:
    """A block in which Parquet's errors become RecordsError; running out of memory stays MemoryError."""
    try:
        yield
    except MemoryError:
        raise
    except (pa.ArrowException, OSError) as error:
        raise RecordsError(f"not a readable Parquet file: {error}") from None
