"""Turn a search space and a strategy into trials' parameters: grid, random search, or TPE.

Random search and TPE are Optuna's samplers driven through ask/tell on an in-memory study, rebuilt from the
trials recorded so far each time more are needed; nothing of Optuna is stored. Same seed and same history
give the same parameters.

TPE proposes from results, so it cannot name every trial up front: the first `TPE_FIRST_WAVE` trials are
drawn at once (TPE's random start-up), and each later trial is asked for when an earlier one ends, told the
results of all ended trials (trials still running are told as running, so TPE does not repeat them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from webapp.config import MAX_TRIALS
from webapp.experiments.search_space import SearchSpace, SearchSpaceError, Value

Strategy = Literal["grid", "random", "tpe"]
TPE_FIRST_WAVE = 4


@dataclass(frozen=True)
class Outcome:
    """A trial TPE has seen: its parameters and its best validation loss (None: running, failed, cancelled)."""

    params: dict[str, Value]
    value: float | None
    ended: bool


def _distributions(space: SearchSpace) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    distributions: dict[str, Any] = {}
    for d in space:
        if d.kind == "categorical":
            distributions[d.name] = CategoricalDistribution(list(d.values))
        elif d.kind == "int":
            distributions[d.name] = IntDistribution(int(d.low or 0), int(d.high or 0), step=d.step or 1)
        else:
            distributions[d.name] = FloatDistribution(float(d.low or 0), float(d.high or 0),
                                                      log=d.kind == "logfloat")
    return distributions


def _study(sampler: Any) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="minimize", sampler=sampler)


def initial_trials(space: SearchSpace, *, strategy: Strategy, n_trials: int, seed: int) -> list[dict[str, Value]]:
    """The parameters of the trials an experiment starts with (for TPE, its first wave).

    Grid: every combination (`n_trials` ignored). Random: `n_trials` samples. TPE: min(`n_trials`,
    `TPE_FIRST_WAVE`) start-up samples. Raises SearchSpaceError for a grid over the cap or a bad count.
    """
    if strategy == "grid":
        return space.grid()
    if not 1 <= n_trials <= MAX_TRIALS:
        raise SearchSpaceError(f"Ask for between 1 and {MAX_TRIALS} trials, not {n_trials}.", field="n_trials")
    if strategy == "random":
        from optuna.samplers import RandomSampler

        return _ask(_study(RandomSampler(seed=seed)), space, n_trials)
    if strategy == "tpe":
        return next_tpe_trials(space, n_trials=n_trials, seed=seed, history=[], count=min(n_trials, TPE_FIRST_WAVE))
    raise SearchSpaceError(f"Unknown strategy {strategy!r}.", field="strategy")


def next_tpe_trials(
    space: SearchSpace, *, n_trials: int, seed: int, history: Sequence[Outcome], count: int
) -> list[dict[str, Value]]:
    """Up to `count` more TPE proposals after `history` (never beyond `n_trials` in all)."""
    from optuna.samplers import TPESampler
    from optuna.trial import TrialState, create_trial

    count = min(count, n_trials - len(history))
    if count <= 0:
        return []
    distributions = _distributions(space)
    # A fresh sampler per wave: offset the seed by the history's length so start-up draws never repeat.
    sampler = TPESampler(seed=seed + len(history), n_startup_trials=TPE_FIRST_WAVE, constant_liar=True)
    study = _study(sampler)
    for outcome in history:
        if outcome.value is not None:
            state = TrialState.COMPLETE
        else:
            state = TrialState.FAIL if outcome.ended else TrialState.RUNNING
        params = {k: v for k, v in outcome.params.items() if k in distributions}
        if set(params) != set(distributions):
            continue  # the space changed since (a clone's history does not apply)
        study.add_trial(create_trial(params=params, distributions=distributions, state=state, value=outcome.value))
    return _ask(study, space, count)


def _ask(study: Any, space: SearchSpace, count: int) -> list[dict[str, Value]]:
    distributions = _distributions(space)
    names = [d.name for d in space]
    asked = []
    for _ in range(count):
        trial = study.ask(distributions)
        asked.append({name: trial.params[name] for name in names})
    return asked
