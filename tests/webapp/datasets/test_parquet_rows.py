"""A Parquet file is read within bounds its metadata gives before anything is decoded: the columns read may decode
to so much in all, a row group whose rows are over the limit of a row on average is not decoded at all, and a
decoded row over the limit is a bad row as in every other format."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from webapp.datasets import parquet_rows as module
from webapp.datasets.file_rows import MAX_ROW_BYTES, BadRow
from webapp.datasets.layouts import RecordsError
from webapp.datasets.parquet_rows import decode_plan, parquet_rows

MIB = 1 << 20


def bomb(path: Path, *, groups: int, mib: int, extra: list[str] | None = None) -> Path:
    """`groups` row groups of one row each: a string of `mib` MiB, which zstd packs into a few hundred bytes."""
    schema = pa.schema([("text", pa.string()), ("note", pa.string())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for _ in range(groups):
            writer.write_table(pa.table({"text": ["x" * (mib * MIB)], "note": ["n"]}, schema=schema))
        for text in extra or []:
            writer.write_table(pa.table({"text": [text], "note": ["n"]}, schema=schema))
    return path


def test_a_file_that_decodes_past_the_bound_is_refused_before_a_value_is_read(tmp_path, monkeypatch):
    path = bomb(tmp_path / "bomb.parquet", groups=16, mib=24)
    assert path.stat().st_size < 64 << 10
    decoded: list[object] = []
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda *args, **kwargs: decoded.append(args) or iter(()))
    with pytest.raises(RecordsError, match=r"^its columns 'text' decode to 402,6\d\d,\d\d\d bytes \(the file's "
                                           r"metadata says\), over the limit of 268,435,456 bytes for one file "
                                           r"\(HYDRA_MAX_DECODED_MB\); split the file$"):
        list(parquet_rows(str(path), ["text"], max_decoded_bytes=256 * MIB))
    assert decoded == []


def test_the_rows_of_a_row_group_over_the_limit_of_a_row_are_bad_without_being_decoded(tmp_path, monkeypatch):
    path = bomb(tmp_path / "mixed.parquet", groups=2, mib=3, extra=["fine", "also fine"])
    read_groups: list[list[int]] = []
    iter_batches = pq.ParquetFile.iter_batches

    def counted(self, *args, row_groups, **kwargs):
        read_groups.append(row_groups)
        return iter_batches(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    rows = list(parquet_rows(str(path), ["text"], max_decoded_bytes=1 << 30))
    assert [type(row).__name__ for row in rows] == ["BadRow", "BadRow", "tuple", "tuple"]
    assert rows[0].reason.startswith("its row group (rows 1 to 1) decodes to 3,145,7")
    assert rows[0].reason.endswith(f"bytes, more than {MAX_ROW_BYTES:,} a row: not read")
    assert rows[2:] == [(3, {"text": "fine"}), (4, {"text": "also fine"})]
    assert read_groups == [[2], [3]]  # the two large row groups were never decoded


def test_a_file_whose_every_row_group_is_over_the_limit_of_a_row_is_refused(tmp_path):
    path = bomb(tmp_path / "bomb.parquet", groups=4, mib=2)
    with pytest.raises(RecordsError, match=r"^no row can be read: every row group decodes to more than 1,048,576 "
                                           r"bytes a row"):
        decode_plan(str(path), ["text"], max_decoded_bytes=1 << 30)


def test_only_the_columns_read_count(tmp_path):
    path = bomb(tmp_path / "bomb.parquet", groups=4, mib=2, extra=["fine"])
    assert [group.decoded_bytes < 100 for group in decode_plan(str(path), ["note"], max_decoded_bytes=1000)] == [
        True] * 5


def test_a_decoded_row_over_the_limit_is_a_bad_row(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a", "y" * (MAX_ROW_BYTES + 1), *["b"] * 8]}), path, row_group_size=10)
    rows = list(parquet_rows(str(path), ["text"], max_decoded_bytes=1 << 30))
    assert rows[1] == BadRow(2, f"the row takes {MAX_ROW_BYTES + 1:,} bytes; a row may take at most "
                                f"{MAX_ROW_BYTES:,} bytes (1 MiB)")
    assert [row[0] for row in rows if isinstance(row, tuple)] == [1, *range(3, 11)]


def test_rows_are_decoded_in_batches_bounded_by_their_size(tmp_path, monkeypatch):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["z" * 1000] * 64}), path, row_group_size=64, compression="none",
                   use_dictionary=False)
    sizes: list[int] = []
    iter_batches = pq.ParquetFile.iter_batches

    def recorded(self, batch_size, **kwargs):
        sizes.append(batch_size)
        return iter_batches(self, batch_size, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recorded)
    monkeypatch.setattr(module, "BATCH_BYTES", 10_000)
    assert len(list(parquet_rows(str(path), ["text"], max_decoded_bytes=1 << 30))) == 64
    assert sizes and 1 <= sizes[0] <= 10


def test_a_column_nested_past_the_limit_is_refused(tmp_path):
    kind: pa.DataType = pa.string()
    value: object = "deep"
    for _ in range(101):
        kind, value = pa.list_(kind), [value]
    path = tmp_path / "deep.parquet"
    pq.write_table(pa.table({"messages": pa.array([value], type=kind)}), path)
    with pytest.raises(RecordsError, match=r"^not a readable Parquet file: Parquet schema too deeply nested"):
        decode_plan(str(path), ["messages"], max_decoded_bytes=1 << 30)


def test_values_repeated_from_a_dictionary_count_once_per_row_against_the_bound(tmp_path):
    path = tmp_path / "repeated.parquet"
    pq.write_table(pa.table({"text": ["r" * 100_000] * 200}), path, use_dictionary=True, compression="zstd")
    assert decode_plan(str(path), ["text"], max_decoded_bytes=5 * MIB)[0].decoded_bytes < MIB  # stored once
    rows = parquet_rows(str(path), ["text"], max_decoded_bytes=5 * MIB)
    with pytest.raises(RecordsError, match=r"^its columns 'text' decode to more than 5,242,880 bytes, the limit for "
                                           r"one file \(HYDRA_MAX_DECODED_MB\), by row 53; split the file$"):
        list(rows)
