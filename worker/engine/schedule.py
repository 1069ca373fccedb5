"""Pure schedules: the learning-rate multiplier per step and the unit timetable of a trial.

Unit timetable of one optimizer step with 3 shards and 2 micro-batches (time flows right)::

    mb 0: F0 F1 FB2 B1 B0 | mb 1: F0 F1 FB2 B1 B0 | [eval: E0 E1 E2 per eval batch]

``F`` runs a shard forward without an autograd graph and saves its output; ``FB`` is the last shard's
forward + loss + backward; ``B`` reloads a shard, recomputes its forward from the saved input (same RNG)
and backpropagates. The optimizer step of a shard is applied lazily, the next time the shard is loaded
(its first unit of the next step, or an eval unit), because global-norm clipping needs every shard's
gradient norm first. If the trial ends without a final evaluation, ``S`` units apply the last step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from worker.engine.config import ScheduleSpec

Phase = Literal["F", "FB", "B", "E", "S"]


def lr_factor(schedule: ScheduleSpec, step: int, total_steps: int) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based).

    Warm-up: ``step / warmup_steps`` while ``step < warmup_steps``; then, with
    ``progress = (step - warmup) / max(1, total - warmup)``: constant ``1``, linear ``max(0, 1 - progress)``,
    cosine ``max(0, 0.5 * (1 + cos(pi * progress)))`` — the transformers ``get_*_schedule_with_warmup``
    definitions, so a ``LambdaLR`` with this function reproduces the engine's rates exactly.
    """
    warmup = schedule.warmup_steps
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if schedule.decay == "constant":
        return 1.0
    if schedule.decay == "linear":
        return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup)))
    progress = float(step - warmup) / float(max(1, total_steps - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    """One unit of work: ``phase`` on ``shard`` for optimizer step ``step``.

    ``micro_batch`` is the micro-batch (F/FB/B) or the evaluation batch (E); 0 for S units.
    ``index`` is the unit's position in the trial's timetable (the manifest cursor).
    """

    index: int
    step: int
    micro_batch: int
    phase: Phase
    shard: int


@dataclass(frozen=True, kw_only=True)
class Timetable:
    """The fixed unit sequence of a trial, addressable by index without materializing it."""

    shards: int
    steps: int
    micro_batches: int
    eval_every: int
    eval_batches: int

    @property
    def train_units_per_step(self) -> int:
        return self.micro_batches * (2 * self.shards - 1)

    @property
    def eval_units(self) -> int:
        return self.eval_batches * self.shards

    def _evals_before(self, step: int) -> int:
        return 0 if self.eval_every == 0 else min(step, self.steps - 1) // self.eval_every

    def step_offset(self, step: int) -> int:
        """Index of the first unit of ``step`` (``step == steps`` gives the offset of the S units)."""
        offset = step * self.train_units_per_step + self._evals_before(step) * self.eval_units
        if step == self.steps and self.eval_every > 0:
            offset += self.eval_units  # the last step always evaluates
        return offset

    def __len__(self) -> int:
        return self.step_offset(self.steps) + (0 if self.eval_every > 0 else self.shards)

    def __iter__(self) -> Iterator[UnitSpec]:
        return (self[index] for index in range(len(self)))

    def __getitem__(self, index: int) -> UnitSpec:
        if not 0 <= index < len(self):
            raise IndexError(index)
        low, high = 0, self.steps  # find the last step whose offset is <= index
        while low < high:
            mid = (low + high + 1) // 2
            if self.step_offset(mid) <= index:
                low = mid
            else:
                high = mid - 1
        step, local = low, index - self.step_offset(low)
        if step == self.steps:
            return UnitSpec(index=index, step=step - 1, micro_batch=0, phase="S", shard=local)
        if local >= self.train_units_per_step:
            batch, shard = divmod(local - self.train_units_per_step, self.shards)
            return UnitSpec(index=index, step=step, micro_batch=batch, phase="E", shard=shard)
        micro_batch, position = divmod(local, 2 * self.shards - 1)
        last = self.shards - 1
        if position < last:
            phase: Phase
            phase, shard = "F", position
        elif position == last:
            phase, shard = "FB", last
        else:
            phase, shard = "B", 2 * last - position
        return UnitSpec(index=index, step=step, micro_batch=micro_batch, phase=phase, shard=shard)
