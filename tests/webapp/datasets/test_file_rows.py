"""The rows of JSONL, JSON and CSV files are read by one rule wherever they stand: a row over 1 MiB, or nested over
100 levels, is one bad row with its line, read past without holding it, and the rows after it read as usual; a
JSON array is read element by element, however its text falls into the pieces it is read in."""

from __future__ import annotations

import io
import json
import random
import re

import pytest

from webapp.datasets import file_rows
from webapp.datasets.file_rows import MAX_DEPTH, MAX_ROW_BYTES, BadRow, csv_header, text_rows
from webapp.datasets.layouts import RecordsError

TOO_LONG = "a row may take at most 1,048,576 bytes (1 MiB)"
TOO_DEEP = "the row nests deeper than 100 levels"


def rows(content: bytes, suffix: str) -> list[object]:
    return list(text_rows(io.BytesIO(content), suffix=suffix))


def jsonl(*values: object) -> bytes:
    return "".join(json.dumps(value) + "\n" for value in values).encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", [0, 5])
def test_a_jsonl_row_over_the_limit_is_one_bad_row_wherever_it_stands(where):
    good = [{"text": f"row {k}"} for k in range(8)]
    long = json.dumps({"text": "x" * (2 << 20)}).encode() + b"\n"
    lines = jsonl(*good).splitlines(keepends=True)
    content = b"".join([*lines[:where], long, *lines[where:]])

    read = rows(content, ".jsonl")

    assert read[where] == BadRow(where + 1, f"the row takes {len(long):,} bytes; {TOO_LONG}")
    assert [row for row in read if not isinstance(row, BadRow)] == [
        (number if number <= where else number + 1, value) for number, value in enumerate(good, 1)]


def test_a_row_of_exactly_the_limit_is_read():
    line = json.dumps({"text": ""}).encode()
    line = line[:-2] + b"x" * (MAX_ROW_BYTES - len(line) - 1) + b'"}\n'
    assert len(line) == MAX_ROW_BYTES
    (number, value), = rows(line, ".jsonl")
    assert (number, len(value["text"])) == (1, MAX_ROW_BYTES - 13)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_row_nested_past_the_limit_is_one_bad_row_and_the_next_rows_read(suffix):
    deep = '{"text": ' + nested(100_000) + "}"
    at_limit = {"text": "ok", "tree": json.loads(nested(MAX_DEPTH - 1))}
    if suffix == ".jsonl":
        content = (json.dumps({"text": "one"}) + "\n" + deep + "\n").encode() + jsonl(at_limit)
    else:
        content = f'[{{"text": "one"}}, {deep},\n {json.dumps(at_limit)}]'.encode()
    assert rows(content, suffix) == [(1, {"text": "one"}), BadRow(2, TOO_DEEP), (3, at_limit)]


def test_brackets_inside_strings_do_not_count_as_nesting():
    value = {"text": "[" * 500 + "{" * 500 + '"\\"[' * 50}
    assert rows(jsonl(value), ".jsonl") == [(1, value)]
    assert rows(json.dumps([value]).encode(), ".json") == [(1, value)]


def test_a_json_array_is_read_element_by_element_with_bad_elements_as_bad_rows():
    long = json.dumps({"text": "y" * (MAX_ROW_BYTES + 10)})
    content = ('\ufeff [\n {"text": "a"},\n 7,\n {bad json},\n ' + long + ',\n{"text": "b, ]}"}\n]\n').encode()
    assert rows(content, ".json") == [
        (1, {"text": "a"}), (2, 7),
        BadRow(3, "not valid JSON: Expecting property name enclosed in double quotes at character 2 of the row"),
        BadRow(4, f"the row takes {len(long):,} bytes; {TOO_LONG}"),
        (5, {"text": "b, ]}"}),
    ]


def test_a_json_array_reads_the_same_whatever_pieces_its_text_falls_into(monkeypatch):
    generator = random.Random(7)
    values = [{"text": "".join(generator.choice('ab"\\[]{},é\n ') for _ in range(generator.randrange(40))),
               "n": [1, [2, {"k": None}]], "x": generator.random()} for _ in range(200)]
    content = json.dumps(values, indent=1, ensure_ascii=False).encode()
    expected = list(enumerate(values, 1))
    for piece in (1, 2, 3, 7, 64):
        monkeypatch.setattr(file_rows, "READ_BYTES", piece)
        assert rows(content, ".json") == expected, piece


@pytest.mark.parametrize(("content", "message"), [
    (b'[{"text": "a"},\n', "not valid JSON: the file ends inside the array, after row 1"),
    (b'[{"text": "a"} {"text": "b"}]', "not valid JSON: '{' comes after row 1, where ',' or ']' should"),
    (b'[{"text": "a"}] {"text": "b"}', r"not valid JSON: text after the array's closing bracket \(after row 1\)"),
    (b'[{"text": "a"}, {"text": "b', "not valid JSON: the file ends inside row 2"),
    (b'[{"text": "caf\xe9"}]', "invalid UTF-8 at byte 15"),
])
def test_a_json_array_that_cannot_be_followed_is_refused_whole(content, message):
    with pytest.raises(RecordsError, match=f"^{message}$"):
        rows(content, ".json")


def test_a_json_file_that_is_not_an_array_is_read_as_jsonl():
    assert rows(b'\n{"text": "a"}\n{"text": "b"}\n', ".json") == [(2, {"text": "a"}), (3, {"text": "b"})]


def test_a_csv_record_over_the_limit_is_one_bad_row_and_reading_starts_again_on_the_next_line():
    long = "x" * (MAX_ROW_BYTES + 1)
    wide = "w" * 200_000  # over the csv module's own field limit, under a row's
    content = f"prompt,completion\na,b\nlong,{long}\nc,{wide}\nd,e\n".encode()
    assert rows(content, ".csv") == [
        (2, {"prompt": "a", "completion": "b"}),
        BadRow(3, f"the row takes {len(long) + 6:,} bytes; {TOO_LONG}"),
        (4, {"prompt": "c", "completion": wide}),
        (5, {"prompt": "d", "completion": "e"}),
    ]


def test_a_csv_record_over_the_limit_across_lines_is_one_bad_row_read_past_to_its_closing_quote():
    half = "y" * (MAX_ROW_BYTES // 2)
    content = f'text\n"{half}\n{half}\n""{half}""\n{half}"\nnext\n'.encode()
    assert rows(content, ".csv") == [
        BadRow(2, f"the row takes more than {MAX_ROW_BYTES:,} bytes (1 MiB), the most a row may take"),
        (6, {"text": "next"}),
    ]


def test_a_csv_header_with_a_long_field_is_read_and_one_over_the_limit_is_refused():
    assert csv_header(io.BytesIO(b"prompt," + b"x" * 200_000 + b"\na,b\n")) == ["prompt", "x" * 200_000]
    with pytest.raises(RecordsError, match=re.escape(f"the header (line 1) cannot be read: the row takes "
                                                     f"{MAX_ROW_BYTES + 8:,} bytes; {TOO_LONG}")):
        csv_header(io.BytesIO(b"prompt," + b"x" * MAX_ROW_BYTES + b"\n"))
    with pytest.raises(RecordsError, match=r"^the header \(line 1\) cannot be read"):
        rows(b"prompt," + b"x" * MAX_ROW_BYTES + b"\na,b\n", ".csv")
