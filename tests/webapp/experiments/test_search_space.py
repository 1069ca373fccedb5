"""Search spaces: every bad input is a SearchSpaceError naming the parameter and field, and pasted text
costs memory in proportion to its length, whatever it holds."""

from __future__ import annotations

import tracemalloc

import pytest

from webapp.experiments.search_space import (
    GRID_CAP,
    MAX_NODES,
    PARAMETERS,
    QUOTE_CHARS,
    SearchSpaceError,
    load_search_space_text,
    parse_search_space,
    rows_from_space,
    space_from_rows,
)


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


@pytest.mark.parametrize(
    ("raw", "parameter", "field", "words"),
    [
        ({"lr": {"kind": "float", "low": 0.1, "high": 0.01}}, "lr", "high", "reversed"),
        ({"lr": {"kind": "float", "low": 0.01, "high": 0.01}}, "lr", "high", "empty"),
        ({"lr": {"kind": "categorical", "values": []}}, "lr", "values", "at least one"),
        ({"learning_rate": {"values": [1]}}, "learning_rate", "name", "Unknown parameter"),
        ({"lr": {"kind": "logfloat", "low": 0, "high": 1}}, "lr", "low", "outside"),
        ({"batch_size": {"kind": "float", "low": 1, "high": 8}}, "batch_size", "kind", "not allowed"),
        ({"batch_size": {"kind": "int", "low": 1.5, "high": 8}}, "batch_size", "low", "whole number"),
        ({"optimizer": {"values": ["adam"]}}, "optimizer", "values", "not one of"),
        ({"batch_size": {"kind": "int", "low": 1, "high": 8, "step": 0}}, "batch_size", "step", "step"),
        ({"lr": {"kind": "float", "low": "x", "high": 1}}, "lr", "low", "not a number"),
    ],
)
def test_it_rejects_bad_dimensions(raw, parameter, field, words):
    with pytest.raises(SearchSpaceError, match=words) as caught:
        parse_search_space(raw)
    assert caught.value.parameter == parameter
    assert caught.value.field == field


def test_it_rejects_an_empty_space():
    with pytest.raises(SearchSpaceError, match="empty"):
        parse_search_space({})


def test_it_reads_yaml_style_numbers_written_as_strings():
    space = parse_search_space({"lr": {"kind": "logfloat", "low": "1e-4", "high": "1e-2"}})
    assert (space.get("lr").low, space.get("lr").high) == (1e-4, 1e-2)


def test_it_expands_a_grid_first_dimension_slowest():
    space = parse_search_space({
        "lr": {"values": [0.1, 0.2]},
        "batch_size": {"kind": "int", "low": 2, "high": 6, "step": 2},
    })
    assert space.grid() == [
        {"lr": 0.1, "batch_size": 2}, {"lr": 0.1, "batch_size": 4}, {"lr": 0.1, "batch_size": 6},
        {"lr": 0.2, "batch_size": 2}, {"lr": 0.2, "batch_size": 4}, {"lr": 0.2, "batch_size": 6},
    ]


def test_it_caps_the_grid():
    space = parse_search_space({"batch_size": {"kind": "int", "low": 1, "high": 4096}})
    with pytest.raises(SearchSpaceError, match=f"4096 points; the cap is {GRID_CAP}") as caught:
        space.grid()
    assert caught.value.field == "strategy"


def test_it_refuses_to_grid_a_float_range():
    with pytest.raises(SearchSpaceError, match="has no grid"):
        parse_search_space({"lr": {"kind": "float", "low": 0.1, "high": 0.2}}).grid()


def test_it_round_trips_form_rows():
    rows = [
        {"name": "lr", "kind": "logfloat", "low": "1e-4", "high": "0.01", "step": ""},
        {"name": "optimizer", "kind": "categorical", "values": "adamw, sgd"},
        {"name": "n_layer", "kind": "int", "low": "2", "high": "6", "step": "2"},
    ]
    space = space_from_rows(rows)
    assert space.to_dict() == {
        "lr": {"kind": "logfloat", "low": 1e-4, "high": 0.01},
        "optimizer": {"kind": "categorical", "values": ["adamw", "sgd"]},
        "n_layer": {"kind": "int", "low": 2, "high": 6, "step": 2},
    }
    assert space_from_rows(rows_from_space(space)) == space


def test_it_rejects_a_parameter_given_twice():
    with pytest.raises(SearchSpaceError, match="twice"):
        space_from_rows([{"name": "lr", "kind": "categorical", "values": "0.1"}] * 2)


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


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"lr": {"values": [[0.1, 0.2]]}}, "values", "is a list, not a number"),
        ({"lr": {"values": {"a": 1}}}, "values", "is a dict; give a list"),
        ({"lr": {"kind": ["float"] * 1000}}, "kind", "kind a list is not allowed"),
        ({"optimizer": {"values": [["adamw"]]}}, "values", "a list is not one of"),
        ({"lr": {"kind": "float", "low": 10**400, "high": 1}}, "low", "must be finite"),
        ({"batch_size": {"kind": "int", "low": 1, "high": 8, "step": 10**400}}, "step", "-bit integer must be"),
        ({"lr": {"kind": "float", "low": "9" * 5000, "high": 1}}, "low", "must be finite"),
        ({"lr": {1: 2, "foo": 3}}, None, "unknown field(s) '1', 'foo'"),
    ],
)
def test_it_checks_values_are_scalars_before_quoting_them(raw, field, words):
    with pytest.raises(SearchSpaceError) as caught:
        parse_search_space(raw)
    assert words in str(caught.value)
    assert caught.value.field == field


def test_it_quotes_at_most_a_few_dozen_characters_of_user_text():
    name = "x" * 10_000
    for raw in [{name: {"values": [1]}}, {"optimizer": {"values": [name]}}, {"lr": {"kind": name}},
                {"lr": {name: 1}}, {"lr": {"kind": "float", "low": name, "high": 1}}]:
        with pytest.raises(SearchSpaceError) as caught:
            parse_search_space(raw)
        assert name[: QUOTE_CHARS - 3] in str(caught.value)
        # Besides the quote, the message may list the parameters Hydra knows, and nothing else long.
        assert len(str(caught.value)) < 120 + len(", ".join(PARAMETERS)), raw


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


def test_lora_parameters_parse_and_module_lists_are_checked() -> None:
    space = load_search_space_text("lora_r: {values: [4, 8]}\nlora_targets: {values: ['q_proj, v_proj', c_attn]}\n")
    assert space.get("lora_targets").values == ("q_proj,v_proj", "c_attn")
    assert space.get("lora_r").values == (4, 8)
    for bad in ("q_proj;rm -rf", "", "1proj"):
        with pytest.raises(SearchSpaceError, match="comma-separated list of module names"):
            load_search_space_text(f"lora_targets: {{values: ['{bad}']}}\n")
    with pytest.raises(SearchSpaceError, match="lora_r"):
        load_search_space_text("lora_r: {values: [-1]}\n")
