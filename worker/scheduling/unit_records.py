"""The scheduler's records of the engine's work on a trial: the first unit's time estimate before any unit ran,
a trial's progress as its session last read its store, and one unit's `worker.engine.session.UnitResult` as the
queue's `UnitDone` with its step and evaluation metrics. Pure functions, kept apart from `EngineRunner`'s state,
so that what the queue and the telemetry receive can be read in one place."""

from __future__ import annotations

import time
from pathlib import Path

from worker.engine.partition import MemoryPlan
from worker.engine.session import TrialSession, UnitResult
from worker.scheduling.policy import BaseShard
from worker.scheduling.runner import UnitDone
from worker.scheduling.telemetry import EvalMetrics, StepMetrics


def first_unit_estimate(plan: MemoryPlan) -> float:
    """Seconds per unit before any unit ran, from the profiled forward+backward time of each layer.

    Per micro-batch, n shards run 2n - 1 units: every layer forward once without a graph (about a third
    of forward+backward) and forward+backward once, so about 4/3 of the profiled time over 2n - 1 units.
    """
    units = 2 * len(plan.shards) - 1
    return max(1e-6, 4 / 3 * sum(layer.time_s for layer in plan.layers) / units)


def _shard_of(read: tuple[Path, int, int] | None) -> BaseShard | None:
    """The scheduler's name for base layers a unit reads (the base's directory is named by its key)."""
    return None if read is None else BaseShard(read[0].name, read[1], read[2])


def progress_of(session: TrialSession) -> tuple[int, list[int], int]:
    """The trial's units left, its ready lanes and the commit they are as of, as `session` last read its store."""
    ready, version = session.ready_lanes(), session.store.commit_version
    return len(session.timetable) - session.state.units_committed, ready, version


def unit_done(trial_id: str, result: UnitResult, remaining_units: int, ready: list[int] | None = None,
              ready_version: int = 0, *, keeps: bool = False, base: BaseShard | None = None,
              next_base: BaseShard | None = None, rung: int | None = None) -> UnitDone:
    """Translate the engine's result of one unit into the scheduler's record: the trial then has `remaining_units`
    left and `ready` lanes as of its store's commit `ready_version` (see `progress_of`). `rung`: the pruner's
    rung the trial reached at this unit's evaluation."""
    unit = result.unit
    now = time.time()
    steps = (
        [StepMetrics(trial=trial_id, step=unit.step, loss=result.loss, lr=result.lr or 0.0,
                     tokens=result.tokens or 0, time=now, rewards_chosen=result.rewards_chosen,
                     rewards_rejected=result.rewards_rejected, reward_accuracy=result.reward_accuracy)]
        if result.loss is not None else []
    )
    evals = (
        [EvalMetrics(trial=trial_id, step=unit.step if result.final_step is None else result.final_step - 1,
                     loss=result.eval_loss, perplexity=result.eval_ppl or 0.0, time=now,
                     bpb=-1.0 if result.eval_bpb is None else result.eval_bpb, tokens=result.eval_tokens or 0,
                     bytes=result.eval_bytes or 0, final=int(result.final_step is not None),
                     rewards_chosen=result.eval_rewards_chosen, rewards_rejected=result.eval_rewards_rejected,
                     reward_margin=result.eval_reward_margin, reward_accuracy=result.eval_reward_accuracy)]
        if result.eval_loss is not None else []
    )
    return UnitDone(
        remaining_units=remaining_units, step=unit.step, micro_batch=unit.micro_batch, phase=unit.phase,
        shard=unit.shard, bytes_moved=result.bytes_read + result.bytes_written,
        peak_bytes=result.peak_device_bytes or 0, io_s=result.io_s, steps=steps, evals=evals, keeps_activations=keeps,
        base=base, next_base=next_base, pruned=result.pruned is not None, rung=rung,
        ready=[0] if ready is None else ready, ready_version=ready_version,
        message=(result.pruned if result.pruned is not None else
                 f"stopped early after step {unit.step + 1}: no lower validation loss in the last "
                 f"evaluations (patience)" if result.stopped_early else ""),
    )
