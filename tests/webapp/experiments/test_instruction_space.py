"""The search space's instruction parameters: packing as YAML's booleans (a form row's words for them too),
loss_on's three values, and max_seq_len as another name of seq_len; every strategy draws them."""

from __future__ import annotations

import pytest

from webapp.experiments.search_space import SearchSpaceError, rows_from_space, space_from_rows
from webapp.experiments.space_text import load_search_space_text
from webapp.experiments.trial_generation import initial_trials


def test_packing_is_true_or_false_in_yaml_and_in_a_row():
    space = load_search_space_text("packing: [true, false]\nloss_on: {values: [assistant, last, all]}")
    assert space.to_dict() == {"packing": {"kind": "categorical", "values": [True, False]},
                               "loss_on": {"kind": "categorical", "values": ["assistant", "last", "all"]}}
    rows = rows_from_space(space)
    assert rows[0]["values"] == "true, false"
    assert space_from_rows(rows) == space
    assert space_from_rows([{"name": "packing", "kind": "categorical", "values": "On, off, yes"}]).to_dict() == {
        "packing": {"kind": "categorical", "values": [True, False]}}


def test_max_seq_len_is_seq_len():
    space = load_search_space_text("max_seq_len: {kind: int, low: 128, high: 512, step: 128}")
    assert space.to_dict() == {"seq_len": {"kind": "int", "low": 128, "high": 512, "step": 128}}
    with pytest.raises(SearchSpaceError, match="max_seq_len: the range is reversed"):
        load_search_space_text("max_seq_len: {kind: int, low: 512, high: 128}")


@pytest.mark.parametrize("strategy", ["grid", "random", "tpe"])
def test_every_strategy_draws_the_instruction_parameters(strategy):
    space = load_search_space_text("packing: [true, false]\nloss_on: [assistant, last]\nmax_seq_len: [64]")
    trials = initial_trials(space, strategy=strategy, n_trials=4, seed=0)
    assert len(trials) == 4
    for params in trials:
        assert set(params) == {"packing", "loss_on", "seq_len"}
        assert isinstance(params["packing"], bool) and params["loss_on"] in ("assistant", "last")
