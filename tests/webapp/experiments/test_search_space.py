"""Search spaces: every bad input is a SearchSpaceError naming the parameter and field, all of a space's at
once, and an unknown name is answered with the parameter it most likely means."""

from __future__ import annotations

import pytest

from webapp.experiments.search_space import (
    GRID_CAP,
    PARAMETERS,
    QUOTE_CHARS,
    SearchSpaceError,
    parse_search_space,
    rows_from_space,
    space_from_rows,
)
from webapp.experiments.space_text import load_search_space_text


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


def test_lora_parameters_parse_and_module_lists_are_checked() -> None:
    space = load_search_space_text("lora_r: {values: [4, 8]}\nlora_targets: {values: ['q_proj, v_proj', c_attn]}\n")
    assert space.get("lora_targets").values == ("q_proj,v_proj", "c_attn")
    assert space.get("lora_r").values == (4, 8)
    for bad in ("q_proj;rm -rf", "", "1proj"):
        with pytest.raises(SearchSpaceError, match="comma-separated list of module names"):
            load_search_space_text(f"lora_targets: {{values: ['{bad}']}}\n")
    with pytest.raises(SearchSpaceError, match="lora_r"):
        load_search_space_text("lora_r: {values: [-1]}\n")


@pytest.mark.parametrize(("raw", "values"), [
    ({"lr": 0.001}, (0.001,)), ({"optimizer": "sgd"}, ("sgd",)), ({"packing": True}, (True,)),
    ({"batch_size": "8"}, (8,)),
])
def test_a_bare_value_is_a_fixed_parameter_of_one_value(raw, values):
    (dimension,) = parse_search_space(raw)
    assert (dimension.kind, dimension.values) == ("categorical", values)


@pytest.mark.parametrize(("name", "meant"), [
    ("lora_rank", "lora_r"), ("learning_rate", "lr"), ("Batch_Size", "batch_size"), ("warmup", "warmup_steps"),
    ("target_modules", "lora_targets"), ("max_grad_norm", "clip_norm"),
])
def test_an_unknown_name_is_answered_with_the_parameter_it_likely_means(name, meant):
    with pytest.raises(SearchSpaceError) as caught:
        parse_search_space({name: [1]})
    assert f"Unknown parameter {name!r}; did you mean {meant}?" in str(caught.value)
    assert (caught.value.parameter, caught.value.field) == (name, "name")


def test_a_name_like_no_parameter_gets_no_guess():
    with pytest.raises(SearchSpaceError) as caught:
        parse_search_space({"zzzz": [1]})
    assert "Unknown parameter 'zzzz'. Hydra searches lr, batch_size" in str(caught.value)


def test_every_bad_parameter_is_reported_at_once():
    with pytest.raises(SearchSpaceError) as caught:
        parse_search_space({"lora_rank": [8], "lr": 0.001, "batch_sise": [1], "optimizer": ["adam"]})
    errors = caught.value.errors
    assert [(e.parameter, e.field) for e in errors] == [("lora_rank", "name"), ("batch_sise", "name"),
                                                        ("optimizer", "values")]
    assert str(caught.value).splitlines() == [str(e) for e in errors]
    assert "did you mean batch_size?" in str(errors[1]) and "'adam' is not one of adamw, sgd" in str(errors[2])


def test_every_bad_row_is_reported_at_once():
    with pytest.raises(SearchSpaceError) as caught:
        space_from_rows([{"name": "lr", "kind": "categorical", "values": "fast"},
                         {"name": "batch_size", "kind": "int", "low": "8", "high": "2"},
                         {"name": "optimizer", "kind": "categorical", "values": "adamw"}])
    assert [(e.parameter, e.field) for e in caught.value.errors] == [("lr", "values"), ("batch_size", "high")]
