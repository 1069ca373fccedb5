"""read_records turns instruction and chat files of every format and kind into normalized examples, and every
bad row into its line and reason, without stopping; files it cannot read at all are refused with why."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from webapp.datasets.layouts import Kind, Layout
from webapp.datasets.records import BadRow, Example, Records, RecordsError
from webapp.datasets.records import read_records as read_with_bounds

MAX_DECODED = 1 << 30
MESSAGES = Layout(Kind.MESSAGES, {"messages": "messages"})


def read_records(path: Path, **options: object) -> Records:
    return read_with_bounds(path, max_decoded_bytes=MAX_DECODED, **options)


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def jsonl(*rows: object) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def chat(*pairs: tuple[str, str]) -> tuple[dict[str, str], ...]:
    return tuple({"role": role, "content": content} for role, content in pairs)


def reasons(records: Records) -> list[tuple[int, str]]:
    return [(row.line, row.reason) for row in records.bad]


def test_it_reads_openai_messages_from_jsonl_keeping_strings_exactly(tmp_path):
    path = write(tmp_path, "chat.jsonl", jsonl(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi \n"},
                      {"role": "assistant", "content": "Hello.", "weight": 1}], "id": 7},
    ) + "\n   \n" + jsonl(
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]},
    ))
    assert read_records(path) == Records(
        layout=MESSAGES,
        examples=[
            Example(line=1, text=None, messages=chat(("system", "Be brief."), ("user", " Hi \n"),
                                                     ("assistant", "Hello."))),
            Example(line=4, text=None, messages=chat(("user", "2+2?"), ("assistant", "4"), ("user", "And 3+3?"),
                                                     ("assistant", "6"))),
        ],
        bad=[],
        rows=2,
    )


def test_it_maps_sharegpt_conversations_to_system_user_and_assistant(tmp_path):
    path = write(tmp_path, "chat.ndjson", jsonl(
        {"conversations": [{"from": "system", "value": "You translate."}, {"from": "human", "value": "chat"},
                           {"from": "gpt", "value": "cat"}]},
        {"conversations": [{"from": "human", "value": "hund"}, {"from": "gpt", "value": "dog"}]},
    ))
    records = read_records(path)
    assert records.layout == Layout(Kind.MESSAGES, {"messages": "conversations"})
    assert records.examples == [
        Example(line=1, text=None, messages=chat(("system", "You translate."), ("user", "chat"), ("assistant", "cat"))),
        Example(line=2, text=None, messages=chat(("user", "hund"), ("assistant", "dog"))),
    ]


def test_it_reads_an_alpaca_json_array_joining_a_nonblank_input_to_the_instruction(tmp_path):
    path = write(tmp_path, "alpaca.json", json.dumps([
        {"instruction": "Add.", "input": "2 and 3", "output": "5"},
        {"instruction": "Name a colour.", "input": "", "output": "Red"},
        {"instruction": "Name a fruit.", "input": "  ", "output": "Pear"},
        {"instruction": "Name a tree.", "output": "Oak"},
    ], indent=2))
    assert read_records(path) == Records(
        layout=Layout(Kind.ALPACA, {"instruction": "instruction", "input": "input", "output": "output"}),
        examples=[
            Example(line=1, text=None, messages=chat(("user", "Add.\n\n2 and 3"), ("assistant", "5"))),
            Example(line=2, text=None, messages=chat(("user", "Name a colour."), ("assistant", "Red"))),
            Example(line=3, text=None, messages=chat(("user", "Name a fruit."), ("assistant", "Pear"))),
            Example(line=4, text=None, messages=chat(("user", "Name a tree."), ("assistant", "Oak"))),
        ],
        bad=[],
        rows=4,
    )


def test_it_reads_jsonl_content_in_a_json_file(tmp_path):
    path = write(tmp_path, "plain.json", "\n" + jsonl({"text": "one"}, {"text": "two"}))
    assert read_records(path).examples == [Example(line=2, text="one", messages=()),
                                           Example(line=3, text="two", messages=())]


def test_it_reads_csv_prompt_completion_with_a_quoted_field_spanning_lines(tmp_path):
    path = write(tmp_path, "pairs.csv", (
        "\ufeffprompt,completion,source\r\n"
        "Say hi,hi,web\r\n"
        '"Write two lines","first\r\nsecond",book\r\n'
        '"Quote ""this""", x ,web\r\n'
        "\r\n"
        "Last,one,web\r\n"
    ))
    assert read_records(path) == Records(
        layout=Layout(Kind.PROMPT_COMPLETION, {"prompt": "prompt", "completion": "completion"}),
        examples=[
            Example(line=2, text=None, messages=chat(("user", "Say hi"), ("assistant", "hi"))),
            Example(line=3, text=None, messages=chat(("user", "Write two lines"), ("assistant", "first\r\nsecond"))),
            Example(line=5, text=None, messages=chat(("user", 'Quote "this"'), ("assistant", " x "))),
            Example(line=7, text=None, messages=chat(("user", "Last"), ("assistant", "one"))),
        ],
        bad=[],
        rows=4,
    )


def test_it_reads_parquet_messages_with_nulls_and_blanks_as_bad_rows(tmp_path):
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    table = pa.table({
        "id": [1, 2, 3],
        "messages": pa.array([
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}],
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
        ], type=pa.list_(message)),
    })
    pq.write_table(table, tmp_path / "chat.parquet", row_group_size=2)
    records = read_records(tmp_path / "chat.parquet")
    assert records == Records(
        layout=MESSAGES,
        examples=[Example(line=1, text=None, messages=chat(("user", "Hi"), ("assistant", "Hello")))],
        bad=[BadRow(2, "missing content in message 2"), BadRow(3, "empty content in message 2")],
        rows=3,
    )


def test_it_reads_parquet_text(tmp_path):
    pq.write_table(pa.table({"text": ["alpha\n", None, " ", "beta"], "score": [1.0, 2.0, 3.0, 4.0]}),
                   tmp_path / "corpus.parquet")
    records = read_records(tmp_path / "corpus.parquet")
    assert records == Records(
        layout=Layout(Kind.TEXT, {"text": "text"}),
        examples=[Example(line=1, text="alpha\n", messages=()), Example(line=4, text="beta", messages=())],
        bad=[BadRow(2, "missing 'text'"), BadRow(3, "empty text")],
        rows=4,
    )


def test_it_counts_each_bad_chat_row_with_its_line_and_reason(tmp_path):
    good = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    path = write(tmp_path, "mixed.jsonl", (
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant" "content": "x"}]}\n'
        + jsonl(
            {"messages": good},
            {"messages": [{"role": "user", "content": "Hi"}, {"content": "Hello"}]},
            {"messages": [{"role": "robot", "content": "Hi"}, good[1]]},
            {"messages": [good[0], good[1], {"role": "user", "content": " \n\t"}]},
            {"messages": [good[0], {"role": "assistant", "content": ["Hello"]}]},
            {"messages": "Hi"},
            {"messages": [good[0], "Hello"]},
            {"messages": [good[0], {"role": "user", "content": "Anyone?"}]},
            {"messages": []},
            ["not", "an", "object"],
            {"text": "no messages"},
            {"messages": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Hello"}]},
            {"messages": [{"from": "human", "value": "Hi"}, {"from": "gpt"}]},
            {"messages": [{"role": 3, "content": "Hi"}, good[1]]},
            {"messages": good},
        )
    ))
    records = read_records(path)
    assert records.kind is Kind.MESSAGES
    assert [example.line for example in records.examples] == [2, 16]
    assert records.rows == 16
    assert reasons(records) == [
        (1, "not valid JSON: Expecting ',' delimiter at column 71"),
        (3, "missing role in message 2"),
        (4, "unknown role 'robot' in message 1 (use system, user or assistant)"),
        (5, "empty content in message 3"),
        (6, "content in message 2 is a list, not a string"),
        (7, "'messages' is a str, not a list"),
        (8, "message 2 is a str, not an object"),
        (9, "no assistant message"),
        (10, "no assistant message"),
        (11, "row is a list, not an object"),
        (12, "missing 'messages'"),
        (13, "unknown role 'bot' in message 2 (use human, gpt or system)"),
        (14, "missing value in message 2"),
        (15, "unknown role 3 in message 1 (use system, user or assistant)"),
    ]


def test_it_counts_bad_text_alpaca_and_prompt_rows(tmp_path):
    text = write(tmp_path, "text.jsonl", jsonl({"text": "ok"}, {"text": 5}, {"text": ""}, {"text": None}))
    alpaca = write(tmp_path, "alpaca.jsonl", jsonl(
        {"instruction": "Do.", "output": "Done."},
        {"instruction": "Do.", "input": 3, "output": "Done."},
        {"instruction": "Do.", "output": ""},
        {"instruction": {"a": 1}, "output": "Done."},
    ))
    pairs = write(tmp_path, "pairs.csv", "prompt,completion\nAsk,Answer\n,Answer\nAsk\nAsk, \n")
    assert reasons(read_records(text)) == [(2, "'text' is an int, not a string"), (3, "empty text"),
                                           (4, "missing 'text'")]
    assert reasons(read_records(alpaca)) == [(2, "'input' is an int, not a string"), (3, "empty output"),
                                             (4, "'instruction' is an object, not a string")]
    assert reasons(read_records(pairs)) == [(3, "empty prompt"), (4, "1 fields, the header has 2"),
                                            (5, "empty completion")]


def test_it_counts_invalid_utf8_on_its_line_and_reads_the_rest_of_a_jsonl_file(tmp_path):
    path = write(tmp_path, "text.jsonl", b'{"text": "one"}\n{"text": "two"}\n{"text": "caf\xe9"}\n{"text": "four"}\n')
    records = read_records(path)
    assert [example.text for example in records.examples] == ["one", "two", "four"]
    assert reasons(records) == [(3, "invalid UTF-8 at byte 14")]


def test_it_counts_invalid_utf8_on_its_line_and_reads_the_rest_of_a_csv_file(tmp_path):
    path = write(tmp_path, "text.csv", b'text\none\ncaf\xe9\n"multi\nline \xff"\nfive\n')
    records = read_records(path)
    assert [example.text for example in records.examples] == ["one", "five"]
    assert [example.line for example in records.examples] == [2, 6]
    assert reasons(records) == [(3, "invalid UTF-8 at byte 4"), (4, "invalid UTF-8 at byte 6 (line 5)")]


def test_it_refuses_a_file_of_only_bad_rows_with_the_first_reason(tmp_path):
    path = write(tmp_path, "chat.jsonl", jsonl(*[{"messages": [{"content": "Hi"}]}] * 12))
    with pytest.raises(RecordsError, match=r"^chat\.jsonl: no usable row: 12 rows, all bad; "
                                           r"first: line 1: missing role in message 1$"):
        read_records(path)


def test_it_refuses_an_empty_file(tmp_path):
    with pytest.raises(RecordsError, match="no rows"):
        read_records(write(tmp_path, "empty.jsonl", "\n\n"))


@pytest.mark.parametrize(("name", "content"), [
    ("chat.jsonl", jsonl({"messages": [{"role": "user", "content": "Hi"}]})),
    ("chat.csv", "text\nHi\n"),
])
def test_it_refuses_a_kind_that_does_not_match_the_columns(tmp_path, name, content):
    with pytest.raises(RecordsError, match=r"kind 'alpaca' needs instruction \+ output/response/answer \(optional: "
                                           r"input/context\); found"):
        read_records(write(tmp_path, name, content), kind=Kind.ALPACA)


def test_it_refuses_a_parquet_kind_mismatch_before_reading_rows(tmp_path):
    pq.write_table(pa.table({"text": ["Hi"]}), tmp_path / "corpus.parquet")
    with pytest.raises(RecordsError, match=r"kind 'messages' needs messages/conversations/conversation; found "
                                           r"'text'\. Name the column for messages under Columns"):
        read_records(tmp_path / "corpus.parquet", kind=Kind.MESSAGES)


def test_it_reads_the_kind_given_when_several_match(tmp_path):
    path = write(tmp_path, "both.jsonl", jsonl({"prompt": "Q", "completion": "A", "text": "Q A"}))
    assert read_records(path).kind is Kind.PROMPT_COMPLETION
    assert read_records(path, kind=Kind.TEXT).examples == [Example(line=1, text="Q A", messages=())]


def test_it_refuses_columns_of_no_kind_naming_the_found_and_the_accepted(tmp_path):
    path = write(tmp_path, "odd.csv", "title,body\nQ,A\n")
    with pytest.raises(RecordsError) as raised:
        read_records(path)
    assert str(raised.value) == (
        "odd.csv: no known columns: found 'title', 'body'; accepted: preference: chosen/chosen_response + "
        "rejected/rejected_response (optional: prompt/question/query); messages: messages/conversations/conversation; "
        "alpaca: instruction + output/response/answer (optional: input/context); prompt_completion: "
        "prompt/question/query/input + completion/response/answer/output; text: text. Or name the column of each "
        "role under Columns, e.g. prompt=question, completion=answer"
    )


def test_it_reads_the_columns_given_for_the_roles(tmp_path):
    path = write(tmp_path, "odd.csv", "title,body,notes\nQ,A,n\n")
    records = read_records(path, columns={"prompt": "title", "completion": "body"})
    assert records.layout == Layout(Kind.PROMPT_COMPLETION, {"prompt": "title", "completion": "body"})
    assert records.examples == [Example(line=2, text=None, messages=chat(("user", "Q"), ("assistant", "A")))]


def test_it_refuses_an_unsupported_suffix(tmp_path):
    with pytest.raises(RecordsError, match=r"data\.txt: unsupported format '\.txt'; use \.jsonl, \.ndjson, "
                                           r"\.json, \.csv, \.parquet"):
        read_records(write(tmp_path, "data.txt", "text\n"))


def test_it_refuses_a_json_array_that_is_not_closed(tmp_path):
    with pytest.raises(RecordsError, match=r"^broken\.json: not valid JSON: the file ends inside the array, after "
                                           r"row 1$"):
        read_records(write(tmp_path, "broken.json", '[{"text": "a"},\n'))


def test_it_refuses_a_parquet_file_it_cannot_read(tmp_path):
    with pytest.raises(RecordsError, match="not a readable Parquet file"):
        read_records(write(tmp_path, "fake.parquet", "text\nHi\n"))


def test_it_keeps_the_first_bad_rows_and_counts_them_all(tmp_path):
    path = write(tmp_path, "numbers.json", "[" + "1," * 5_000 + '{"text": "one"}]')
    records = read_records(path)
    assert (len(records.bad), records.n_bad, records.rows) == (1_000, 5_000, 5_001)
    assert records.bad[-1] == BadRow(1_000, "row is an int, not an object")
