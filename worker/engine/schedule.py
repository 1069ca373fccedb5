"""Pure schedules: the learning-rate multiplier per step and the unit timetable of a trial.

Unit timetable of one optimizer step with 3 shards and 2 micro-batches (time flows right)::

    mb 0: F0 F1 FB2 B1 B0 | mb 1: F0 F1 FB2 B1 B0 | [eval: E0 E1 E2 per eval batch]

``F`` runs a shard forward without an autograd graph and saves its output; ``FB`` is the last shard's
forward + loss + backward; ``B`` reloads a shard, recomputes its forward from the saved input (same RNG)
and backpropagates. The optimizer step of a shard is applied lazily, the next time the shard is loaded
(its first unit of the next step, or an eval unit), because global-norm clipping needs every shard's
gradient norm first. If the trial ends without a final evaluation, ``S`` units apply the last step.

A model planned as one shard runs a step as one ``FB`` unit per micro-batch, then one ``S`` unit that finishes the
step (adds the gradients that micro-batches parked, having started before those ahead of them committed, and
takes the norm) and applies its update: the micro-batches of the next step then need nothing of each other and run
side by side (see :class:`Segment`)::

    FB FB FB FB S | [eval: E per eval batch]

(A trial whose store was written before these step units, ``step_units`` false, keeps the timetable it started
with: its first micro-batch applies the update before its forward.)

A DPO trial of full fine-tuning computes its reference log-probabilities once, under its starting weights, before
step 0: ``reference_batches`` batches of ``R`` units (``R0 .. R(n-1)`` each, forward only) open its timetable.

A trial continued after it ended (``TrialSpec.continuations``) is one timetable of segments: each segment's
last step ends as a trial's last step does (its evaluation, or its ``S`` units), so the timetable of a trial
before a continuation is the start of the timetable after it, and the cursor it ended at is where the added
steps begin.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from worker.engine.config import ScheduleSpec, TrialSpec

Phase = Literal["R", "F", "FB", "B", "E", "S"]


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


def step_lr(spec: TrialSpec, step: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based): the trial's ``optimizer.lr`` times
    :func:`lr_factor` over its ``steps``, or, from an added segment's first step on, that segment's ``lr``
    times its own warm-up and decay over its own steps, counted from its first step."""
    for added in reversed(spec.continuations):
        if step >= added.after:
            schedule = ScheduleSpec(warmup_steps=added.warmup_steps, decay=added.decay)
            return added.lr * lr_factor(schedule, step - added.after, added.steps)
    return spec.optimizer.lr * lr_factor(spec.schedule, step, spec.steps)


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    """One unit of work: ``phase`` on ``shard`` for optimizer step ``step``.

    ``micro_batch`` is the micro-batch (F/FB/B), the evaluation batch (E) or the reference batch (R, whose
    ``step`` is 0); 0 for S units.
    ``index`` is the unit's position in the trial's timetable (the manifest cursor).
    """

    index: int
    step: int
    micro_batch: int
    phase: Phase
    shard: int


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A run of the timetable whose units form ``lanes`` chains of ``length`` units each, lane after lane:
    the training of one step (a lane per micro-batch, ``2n - 1`` units each), an evaluation (a lane per
    evaluation batch, ``n`` units each) or the final updates (a lane per shard, of its one unit). Unit ``start +
    lane * length + position`` is position ``position`` of lane ``lane``.

    The units of a segment may run as a *wavefront*: the unit at ``(lane, position)`` needs only the unit before
    it in its own lane and the unit at the same position of the lane before (the same phase on the same shard
    for the previous micro-batch): every shard then sees the same operations in the same order as when the
    lanes run one after another. The lanes of a ``parallel`` segment need nothing of each other (the final
    updates: each applies its own shard's pending step, which no other unit of the segment reads). A segment's
    first unit needs the whole segment before it.

    The lanes of a ``gathered`` segment are of one unit each (a step or an evaluation of a model planned as one
    shard) and run side by side. With ``lead``, the first lane runs first (it applies the step before's pending
    update) and the others need it; with ``tail``, the last lane runs after every other (it reports the sums). Their
    sums still add up in lane order: a lane that starts before every lane before it has committed parks its gradient
    (its evaluation sums), and the next lane that finds every lane before it committed adds the parked ones in order
    before its own (see ``ShardUnits._take_turn``); a last lane that runs after every other always does. A step of
    one shard is gathered without either (its ``S`` unit after it adds what is still parked and applies the update),
    its evaluation with ``tail`` alone; a trial without step units (see the module docstring) has both."""

    start: int
    lanes: int
    length: int
    parallel: bool = False
    gathered: bool = False
    lead: bool = True
    tail: bool = True

    @property
    def stop(self) -> int:
        return self.start + self.lanes * self.length

    def index(self, lane: int, position: int) -> int:
        return self.start + lane * self.length + position

    def place(self, index: int) -> tuple[int, int]:
        """(lane, position) of unit ``index`` of this segment."""
        return divmod(index - self.start, self.length)

    def needs(self, index: int) -> list[int]:
        """The units unit ``index`` of this segment runs after (besides the segment before it)."""
        lane, position = self.place(index)
        if self.gathered:
            if not lane:
                return []
            if self.tail and lane == self.lanes - 1:
                return list(range(self.start, index))
            return [self.start] if self.lead else []
        return ([index - 1] if position else []) + ([index - self.length] if lane and not self.parallel else [])

    def urgency(self, index: int) -> tuple[int, int]:
        """Sort key among the segment's runnable units, most urgent first: the unit with the longest chain of
        units still to follow it (the rest of its lane, then one per later lane), the lower lane on a tie.

        Run in this order, the lanes of a wavefront advance together, so the segment ends with all of them
        nearly done rather than with one lagging lane running alone while the other devices wait for the next
        step (list scheduling by critical path, exact for units of equal length)."""
        lane, position = self.place(index)
        return lane + position, lane


@dataclass(frozen=True, kw_only=True)
class Timetable:
    """The fixed unit sequence of a trial, addressable by index without materializing it.

    ``ends``: the steps at which segments before the last one end (a continued trial's ``after`` values);
    the last segment ends at ``steps``. A segment's last step evaluates (with ``eval_every`` > 0) or is
    followed by one ``S`` unit per shard (a stepped timetable's last step has its own). With
    ``final_eval_batches`` > 0 every segment ends with the final evaluation instead, on that many batches (the
    whole held-out set), whatever ``eval_every``.
    ``reference_batches``: batches of ``R`` units, one per shard each, before step 0. ``step_units``: a plan of
    one shard ends every step with an ``S`` unit (see the module docstring; false for a store written before)."""

    shards: int
    steps: int
    micro_batches: int
    eval_every: int
    eval_batches: int
    ends: tuple[int, ...] = ()
    final_eval_batches: int = 0
    reference_batches: int = 0
    step_units: bool = False

    @classmethod
    def of(cls, spec: TrialSpec, *, shards: int, reference_batches: int = 0, step_units: bool = False) -> Timetable:
        """The timetable of ``spec`` (added segments included) under a plan of ``shards`` shards, opened by
        ``reference_batches`` batches of reference units (a trial's count: ``TrialState.reference_batches``);
        ``step_units``: see the class docstring (``TrialState.step_units``)."""
        return cls(shards=shards, steps=spec.total_steps, micro_batches=spec.micro_batches,
                   eval_every=spec.eval_every, eval_batches=spec.eval_batches,
                   ends=tuple(added.after for added in spec.continuations),
                   final_eval_batches=spec.final_eval_batches, reference_batches=reference_batches,
                   step_units=step_units)

    @property
    def stepped(self) -> bool:
        """Whether every step ends with its own ``S`` unit (a plan of one shard, with ``step_units``)."""
        return self.step_units and self.shards == 1

    @property
    def train_units_per_step(self) -> int:
        return self.micro_batches * (2 * self.shards - 1) + int(self.stepped)

    @property
    def eval_units(self) -> int:
        return self.eval_batches * self.shards

    def evaluates(self, step: int) -> bool:
        """Whether an evaluation follows step ``step``'s training: every ``eval_every`` steps and at the end of
        every segment."""
        if self._ends_segment(step):
            return self.eval_every > 0 or self.final_eval_batches > 0
        return self.eval_every > 0 and (step + 1) % self.eval_every == 0

    def final_evaluation(self, step: int) -> bool:
        """Whether the evaluation after step ``step`` is a final one, on the whole held-out set."""
        return self.final_eval_batches > 0 and self._ends_segment(step)

    @property
    def final_eval_start(self) -> int:
        """Where a trial that stops early goes on: its last segment's final evaluation, or the end."""
        if not self.final_eval_batches:
            return len(self)
        return self.step_offset(self.steps - 1) + self.train_units_per_step

    def _ends_segment(self, step: int) -> bool:
        return step + 1 == self.steps or step + 1 in self.ends

    def step_offset(self, step: int) -> int:
        """Index of the first unit of ``step``: the units of every earlier step (training, then its evaluation
        or final updates, after the reference units); ``step == steps`` gives the timetable's length."""
        offset = self.reference_batches * self.shards + step * self.train_units_per_step
        ends = sum(1 for end in (*self.ends, self.steps) if end <= step)
        if self.final_eval_batches:  # evaluations every eval_every steps but at segment ends, then the finals
            aligned = 0 if not self.eval_every else sum(
                1 for end in (*self.ends, self.steps) if end <= step and not end % self.eval_every)
            regular = 0 if not self.eval_every else step // self.eval_every - aligned
            return offset + regular * self.eval_units + ends * self.final_eval_batches * self.shards
        if self.eval_every > 0:
            unaligned = sum(1 for end in (*self.ends, self.steps) if end <= step and end % self.eval_every)
            return offset + (step // self.eval_every + unaligned) * self.eval_units
        return offset if self.stepped else offset + ends * self.shards  # the final updates (a step's own S)

    def __len__(self) -> int:
        return self.step_offset(self.steps)

    def segment(self, index: int) -> Segment:
        """The segment unit ``index`` belongs to (see :class:`Segment`)."""
        unit = self[index]
        if unit.phase == "R":  # one lane per reference batch, before step 0
            return Segment(start=0, lanes=self.reference_batches, length=self.shards)
        start = self.step_offset(unit.step)
        one = self.shards == 1
        if unit.phase in ("F", "FB", "B"):
            return Segment(start=start, lanes=self.micro_batches, length=2 * self.shards - 1, gathered=one,
                           lead=not self.stepped, tail=not self.stepped)
        if unit.phase == "S" and self.stepped:
            return Segment(start=start + self.micro_batches, lanes=1, length=1, parallel=True)
        start += self.train_units_per_step
        if unit.phase == "S":
            return Segment(start=start, lanes=self.shards, length=1, parallel=True)
        batches = self.final_eval_batches if self.final_evaluation(unit.step) else self.eval_batches
        return Segment(start=start, lanes=batches, length=self.shards, gathered=one, lead=not self.stepped)

    def __iter__(self) -> Iterator[UnitSpec]:
        return (self[index] for index in range(len(self)))

    def __getitem__(self, index: int) -> UnitSpec:
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index < self.reference_batches * self.shards:
            batch, shard = divmod(index, self.shards)
            return UnitSpec(index=index, step=0, micro_batch=batch, phase="R", shard=shard)
        low, high = 0, self.steps - 1  # find the last step whose offset is <= index
        while low < high:
            mid = (low + high + 1) // 2
            if self.step_offset(mid) <= index:
                low = mid
            else:
                high = mid - 1
        step, local = low, index - self.step_offset(low)
        if self.stepped and local == self.micro_batches:
            return UnitSpec(index=index, step=step, micro_batch=0, phase="S", shard=0)
        if local >= self.train_units_per_step:
            batch, shard = divmod(local - self.train_units_per_step, self.shards)
            if self.eval_every > 0 or self.final_eval_batches:
                return UnitSpec(index=index, step=step, micro_batch=batch, phase="E", shard=shard)
            return UnitSpec(index=index, step=step, micro_batch=0, phase="S", shard=shard)
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
