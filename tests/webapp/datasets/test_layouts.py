"""The column of each role: found under the common names people give it, in the kinds' order, or named by the
user; what a user writes for it is checked, and messages about columns stay short however many there are."""

from __future__ import annotations

import pytest

from webapp.datasets.layouts import Kind, Layout, LayoutError, RecordsError, columns_parse, layout_for, listed


@pytest.mark.parametrize(("columns", "layout"), [
    (["prompt", "response"], Layout(Kind.PROMPT_COMPLETION, {"prompt": "prompt", "completion": "response"})),
    (["question", "answer"], Layout(Kind.PROMPT_COMPLETION, {"prompt": "question", "completion": "answer"})),
    (["input", "output"], Layout(Kind.PROMPT_COMPLETION, {"prompt": "input", "completion": "output"})),
    (["query", "response"], Layout(Kind.PROMPT_COMPLETION, {"prompt": "query", "completion": "response"})),
    (["instruction", "context", "response", "category"],  # Dolly
     Layout(Kind.ALPACA, {"instruction": "instruction", "input": "context", "output": "response"})),
    (["instruction", "input", "output"],
     Layout(Kind.ALPACA, {"instruction": "instruction", "input": "input", "output": "output"})),
    (["Question", "Answer"], Layout(Kind.PROMPT_COMPLETION, {"prompt": "Question", "completion": "Answer"})),
    (["conversations", "text"], Layout(Kind.MESSAGES, {"messages": "conversations"})),
    (["messages", "instruction", "output"], Layout(Kind.MESSAGES, {"messages": "messages"})),
    (["prompt", "completion", "text"],
     Layout(Kind.PROMPT_COMPLETION, {"prompt": "prompt", "completion": "completion"})),
    (["text", "prompt"], Layout(Kind.TEXT, {"text": "text"})),
    (["prompt", "question", "answer", "response"],
     Layout(Kind.PROMPT_COMPLETION, {"prompt": "prompt", "completion": "response"})),
])
def test_it_finds_the_kind_and_the_columns_of_the_common_names(columns, layout):
    assert layout_for(columns, kind=None, given={}) == layout


def test_an_exact_name_wins_over_one_in_another_case():
    assert layout_for(["TEXT", "text"], kind=None, given={}).columns == {"text": "text"}


def test_an_optional_role_no_column_holds_is_left_out_unless_rows_may_differ():
    assert layout_for(["instruction", "output"], kind=None, given={}).columns == {"instruction": "instruction",
                                                                                    "output": "output"}
    assert layout_for(["instruction", "output"], kind=None, given={}, fixed=False).columns == {
        "instruction": "instruction", "input": "input", "output": "output"}


def test_the_columns_given_decide_and_the_others_are_found():
    assert layout_for(["q", "answer", "reply"], kind=None, given={"prompt": "q"}) == Layout(
        Kind.PROMPT_COMPLETION, {"prompt": "q", "completion": "answer"})
    assert layout_for(["task", "inp", "out"], kind=None, given={"instruction": "task", "output": "out",
                                                                 "input": "inp"}).kind is Kind.ALPACA
    assert layout_for(["body", "title"], kind=Kind.TEXT, given={"text": "body"}) == Layout(Kind.TEXT,
                                                                                          {"text": "body"})


def test_a_column_given_to_one_role_is_not_found_for_another():
    assert layout_for(["output", "answer"], kind=None, given={"prompt": "output"}).columns == {
        "prompt": "output", "completion": "answer"}


@pytest.mark.parametrize(("columns", "kind", "given", "message"), [
    (["a"], None, {"promt": "a"}, "no role 'promt'; the roles are prompt, chosen, rejected, messages, instruction, "
                                   "input, output, completion, text"),
    (["a", "b"], Kind.TEXT, {"prompt": "a"}, "kind 'text' has the roles text; not 'prompt'"),
    (["a", "b"], None, {"prompt": "c"}, "no column 'c' in the file; found 'a', 'b'"),
    (["a", "b"], None, {"prompt": "a", "text": "b"}, "no kind has all the roles 'prompt', 'text': preference "
                                                     "has prompt (optional), chosen, rejected; messages has messages;"),
])
def test_a_role_or_column_given_that_does_not_fit_is_a_layout_error(columns, kind, given, message):
    with pytest.raises(LayoutError) as raised:
        layout_for(columns, kind=kind, given=given)
    assert str(raised.value).startswith(message)


def test_a_kind_without_its_columns_says_what_to_name():
    with pytest.raises(RecordsError) as raised:
        layout_for(["title", "body"], kind=Kind.PROMPT_COMPLETION, given={"prompt": "title"})
    assert not isinstance(raised.value, LayoutError)
    assert str(raised.value) == (
        "kind 'prompt_completion' needs prompt/question/query/input + completion/response/answer/output; found "
        "'title', 'body'. Name the column for completion under Columns, e.g. completion=your_column")


@pytest.mark.parametrize(("text", "mapping"), [
    ("", {}),
    ("prompt=question, completion=answer", {"prompt": "question", "completion": "answer"}),
    ("prompt = Question \n completion=The answer,", {"prompt": "Question", "completion": "The answer"}),
    ('{"prompt": "q", "completion": "a, b"}', {"prompt": "q", "completion": "a, b"}),
])
def test_it_parses_the_columns_a_user_writes(text, mapping):
    assert columns_parse(text) == mapping


@pytest.mark.parametrize(("text", "message"), [
    ("prompt", "'prompt' is not role=column, e.g. prompt=question"),
    ("prompt=", "every pair needs a role and a column"),
    ("prompt=a, prompt=b", "'prompt' is given twice"),
    ("prompt=a, completion=a", "each role needs a column of its own"),
    ("prompt=a\x00b", "a role or column contains a NUL character"),
    ("prompt=" + "c" * 201, "the column for 'prompt' is over 200 characters"),
    ('{"prompt": 3}', "give a JSON object of role: column strings"),
    ("{" * 5000, "not a JSON object of role: column pairs"),
])
def test_it_refuses_columns_it_cannot_read(text, message):
    with pytest.raises(LayoutError, match=f"^{message}"):
        columns_parse(text)


def test_a_message_lists_the_first_columns_cut_short():
    columns = [f"column_{k}" for k in range(150_000)] + ["x" * 200_000]
    text = listed(columns)
    assert text.startswith("'column_0', 'column_1', ") and text.endswith("'column_19' and 149,981 more")
    assert listed(["y" * 200_000]) == f"'{'y' * 60}… (200,000 characters)'"


def test_a_layout_reading_roles_from_their_own_columns_is_plain():
    assert Layout(Kind.ALPACA, {"instruction": "instruction", "output": "output"}).plain
    assert not Layout(Kind.PROMPT_COMPLETION, {"prompt": "question", "completion": "completion"}).plain


@pytest.mark.parametrize(("columns", "expected"), [
    (["prompt", "chosen", "rejected"], {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}),
    (["chosen", "rejected"], {"chosen": "chosen", "rejected": "rejected"}),
    (["prompt", "prompt_id", "chosen", "rejected", "messages", "score_chosen"],  # UltraFeedback's columns
     {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}),
    (["Question", "Chosen_Response", "Rejected_Response"],
     {"prompt": "Question", "chosen": "Chosen_Response", "rejected": "Rejected_Response"}),
])
def test_a_file_with_chosen_and_rejected_columns_holds_preference_pairs(columns, expected):
    assert layout_for(columns, kind=None, given={}) == Layout(Kind.PREFERENCE, expected)


def test_a_prompt_given_without_answers_is_still_a_prompt_and_completion():
    assert layout_for(["q", "completion"], kind=None, given={"prompt": "q"}).kind is Kind.PROMPT_COMPLETION
    assert layout_for(["q", "good", "bad"], kind=None, given={"prompt": "q", "chosen": "good",
                                                              "rejected": "bad"}).kind is Kind.PREFERENCE
