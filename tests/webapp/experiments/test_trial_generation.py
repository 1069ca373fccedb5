"""Trial generation with fixed seeds: grid order, Optuna random search and TPE through ask/tell."""

from __future__ import annotations

import pytest

from webapp.experiments.search_space import SearchSpaceError, parse_search_space
from webapp.experiments.trial_generation import TPE_FIRST_WAVE, Outcome, initial_trials, next_tpe_trials

SPACE = parse_search_space({
    "lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2},
    "batch_size": {"values": [8, 16]},
    "n_layer": {"kind": "int", "low": 2, "high": 6, "step": 2},
})


def test_it_generates_the_whole_grid():
    space = parse_search_space({"lr": {"values": [0.1, 0.2]}, "optimizer": {"values": ["adamw", "sgd"]}})
    assert initial_trials(space, strategy="grid", n_trials=1, seed=0) == [
        {"lr": 0.1, "optimizer": "adamw"}, {"lr": 0.1, "optimizer": "sgd"},
        {"lr": 0.2, "optimizer": "adamw"}, {"lr": 0.2, "optimizer": "sgd"},
    ]


def test_it_samples_randomly_and_reproducibly_within_the_space():
    first = initial_trials(SPACE, strategy="random", n_trials=6, seed=7)
    assert first == initial_trials(SPACE, strategy="random", n_trials=6, seed=7)
    assert first != initial_trials(SPACE, strategy="random", n_trials=6, seed=8)
    assert len(first) == 6
    for params in first:
        assert 1e-4 <= params["lr"] <= 1e-2
        assert params["batch_size"] in (8, 16)
        assert params["n_layer"] in (2, 4, 6)


def test_it_starts_tpe_with_a_first_wave_and_asks_for_more_as_results_arrive():
    wave = initial_trials(SPACE, strategy="tpe", n_trials=10, seed=3)
    assert len(wave) == TPE_FIRST_WAVE
    assert len({p["lr"] for p in wave}) == TPE_FIRST_WAVE
    history = [Outcome(params=p, value=float(i), ended=True) for i, p in enumerate(wave)]
    more = next_tpe_trials(SPACE, n_trials=10, seed=3, history=history, count=2)
    assert more == next_tpe_trials(SPACE, n_trials=10, seed=3, history=history, count=2)
    assert len(more) == 2
    assert all(m["lr"] not in {p["lr"] for p in wave} for m in more)


def test_it_never_asks_tpe_beyond_the_trial_count():
    history = [Outcome(params=p, value=1.0, ended=True) for p in initial_trials(SPACE, strategy="tpe", n_trials=5,
                                                                                 seed=0)]
    assert len(next_tpe_trials(SPACE, n_trials=5, seed=0, history=history, count=3)) == 1


def test_it_bounds_the_trial_count():
    with pytest.raises(SearchSpaceError, match="between 1 and"):
        initial_trials(SPACE, strategy="random", n_trials=0, seed=0)
