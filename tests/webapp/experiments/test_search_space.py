"""Search spaces: every bad input is a SearchSpaceError naming the parameter and field."""

from __future__ import annotations

import pytest

from webapp.experiments.search_space import (
    GRID_CAP,
    SearchSpaceError,
    parse_search_space,
    rows_from_space,
    space_from_rows,
)


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
