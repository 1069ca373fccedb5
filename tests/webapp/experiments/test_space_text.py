"""Pasted search spaces: text that is neither YAML nor JSON is answered in one line saying where, and pasted text
costs memory in proportion to its length, whatever it holds."""

from __future__ import annotations

import tracemalloc

import pytest

from webapp.experiments.search_space import MAX_NODES, SearchSpaceError
from webapp.experiments.space_text import load_search_space_text


def alias_bomb(levels: int = 9, *, at: str = "kind") -> str:
    """A few hundred characters of YAML whose last alias, `lr`'s field `at`, stands for 9**levels values (the
    anchors sit in a field that is checked after `at`)."""
    anchors = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    anchors += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    holder = "high" if at == "low" else "low"
    kind = "kind: float, " if at == "low" else ""
    return f"lr: {{{kind}{holder}: [{', '.join(anchors)}], {at}: *a{levels - 1}}}"


def peak_bytes(call) -> int:
    """The most memory Python allocated while `call` ran."""
    tracemalloc.start()
    try:
        call()
    except SearchSpaceError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("at", ["kind", "values", "low"])
def test_it_refuses_a_yaml_alias_bomb_without_expanding_it(at):
    text = alias_bomb(9, at=at)  # 9**9 = 387,420,489 values if expanded
    assert len(text) < 700
    with pytest.raises(SearchSpaceError, match="anchors and aliases") as caught:
        load_search_space_text(text)
    assert caught.value.field == "space_text"
    assert peak_bytes(lambda: load_search_space_text(text)) < 1 << 20


def test_it_refuses_a_single_anchor_too():
    with pytest.raises(SearchSpaceError, match="anchors and aliases"):
        load_search_space_text("lr: &x {values: [0.1]}")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 5000, "nests too deep"),
        ("lr: {values: [[[0.1]]]}", "nests too deep"),
        ("lr: {values: [" + ", ".join(["0.1"] * (MAX_NODES + 1)) + "]}", f"more than {MAX_NODES} entries"),
        ("lr: {values: [" + "9" * 5000 + "]}", "number too long"),
        ("lr: {values: [0.1]\n" + "x" * 10_000, "neither YAML nor JSON"),
        ("lr: {values: [0.1]}\x9a", "neither YAML nor JSON"),  # a control character YAML refuses to read
    ],
    ids=["deep-brackets", "deep-values", "too-many-nodes", "long-integer", "broken", "control-character"],
)
def test_it_bounds_what_pasted_text_may_hold(text, words):
    with pytest.raises(SearchSpaceError, match=words) as caught:
        load_search_space_text(text)
    assert caught.value.field == "space_text"
    assert len(str(caught.value)) < 400


def test_it_reads_pasted_yaml_and_json():
    expected = {"lr": {"kind": "categorical", "values": [0.1, 0.01]}, "batch_size": {"kind": "int", "low": 2,
                                                                                      "high": 8, "step": 2}}
    yaml_text = "lr: {values: [0.1, 0.01]}\nbatch_size: {kind: int, low: 2, high: 8, step: 2}\n"
    json_text = '{"lr": {"values": [0.1, 0.01]}, "batch_size": {"kind": "int", "low": 2, "high": 8, "step": 2}}'
    assert load_search_space_text(yaml_text).to_dict() == expected
    assert load_search_space_text(json_text).to_dict() == expected


@pytest.mark.django_db
def test_the_form_page_answers_an_alias_bomb_with_a_field_error(alice_client, alice_dataset):
    from django.urls import reverse

    from tests.webapp.experiments.test_forms import post_data

    url = reverse("experiment_create")
    plain_error = post_data(alice_dataset, action="preview", space_text="lr: {values: [oops]}")
    bomb = post_data(alice_dataset, action="preview", space_text=alias_bomb(9, at="values"))
    alice_client.post(url, plain_error)  # the first request fills caches (templates, URL resolver)
    baseline = peak_bytes(lambda: alice_client.post(url, plain_error))
    responses = []
    peak = peak_bytes(lambda: responses.append(alice_client.post(url, bomb)))
    assert responses[0].status_code == 400
    assert "anchors and aliases (&amp; and *) are not accepted" in responses[0].content.decode()
    assert peak < 2 * baseline, (peak, baseline)




@pytest.mark.parametrize(("text", "message"), [
    ("lr: [0.001, 0.003\nbatch_size: 8", "The pasted text is neither YAML nor JSON: line 2, column 11: expected ',' "
     "or ']', but got ':' (in the [ list that opens at line 1, column 5)."),
    ("lr: 0.001\n  batch_size: 8", "The pasted text is neither YAML nor JSON: line 2, column 13: mapping values are "
     "not allowed here."),
    ("lr: 0.001\n\tbatch_size: 8", "The pasted text is neither YAML nor JSON: line 2, column 1: a tab; YAML "
     "indents with spaces."),
    ('{"lr": [0.001], "batch_size" 8}', "The pasted text is neither YAML nor JSON: line 1, column 30: expected ',' "
     "or '}', but got a value."),
    ("lr: [0.1]\nx: \x9a", "The pasted text is neither YAML nor JSON: line 2, column 4: the character U+009A is "
     "not allowed."),
])
def test_unreadable_text_is_one_line_that_says_where(text, message):
    with pytest.raises(SearchSpaceError) as caught:
        load_search_space_text(text)
    assert str(caught.value) == message
    assert caught.value.field == "space_text"


def test_a_fixed_value_reads_as_one_value():
    space = load_search_space_text("lr: 0.001\nbatch_size: [4, 8]\noptimizer: sgd\n")
    assert space.to_dict() == {"lr": {"kind": "categorical", "values": [0.001]},
                               "batch_size": {"kind": "categorical", "values": [4, 8]},
                               "optimizer": {"kind": "categorical", "values": ["sgd"]}}
