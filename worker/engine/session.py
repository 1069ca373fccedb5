"""Trials as resumable sequences of shard units whose whole state lives in the spill store.

``TrialSession.open`` picks a trial created by :func:`~worker.engine.create.trial_create` up in any
process, and each ``run_unit`` runs the next unit of the timetable (:mod:`worker.engine.schedule`), or the next
unit of one lane of a wavefront, and commits its outputs together with the units now done. A unit killed
half-way leaves the previous commit, and re-running it gives identical numbers because the RNG state is part of
the store.

Spill buffer names (per trial directory)::

    p{s} g{s}        shard s: flat fp32 parameters and accumulated gradients
    m{s} v{s}        shard s: optimizer state (AdamW exp_avg and exp_avg_sq; SGD momentum in m)
    t{m}.{s}         shard s, micro-batch m: gradients of parameters it borrows from another shard (tied weights)
    a{m}.{s} d{m}.{s} output of shard s for micro-batch m, and the loss gradient w.r.t. it
    h{m}.0           a model of one shard, micro-batch m: its gradient, parked until the micro-batches before it
                     are in g0 (worker.engine.gradients)
    r{m}.{s}         RNG state shard s starts its forward on micro-batch m from (the state shard s - 1 left;
                     shard 0 starts from the micro-batch's seed, see worker.engine.rng)
    e{b}.{s}         output of shard s for evaluation batch b
    q{m}.{s} qe{b}.{s} a DPO LoRA trial: the reference's output of shard s for micro-batch m, for evaluation batch b
    qr{b}.{s} lp{c}  a DPO full fine-tune: the reference's output of shard s for reference batch b, and chunk c of
                     the reference log-probabilities (worker.engine.preference_units)

A micro-batch's boundaries, tied gradients and RNG states are dropped by the unit that reads them last, so the
store holds those of the micro-batches in flight.

The small state next to them (cursor, per-shard flags, running sums) is a
:class:`~worker.engine.trial_state.TrialState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worker.engine import optimizer_step, shared_base, spill_pool
from worker.engine.activations import KeptGraph
from worker.engine.create import trial_create
from worker.engine.data import trial_data
from worker.engine.errors import EngineError, LaneNotReady, StaleWriterError
from worker.engine.export import export_lora, export_pretrained
from worker.engine.faults import Fault
from worker.engine.layers import build_layer_stack
from worker.engine.layout import Layout
from worker.engine.rng import caller_rng_kept, rng_state
from worker.engine.schedule import UnitSpec
from worker.engine.shared_base import BaseCache
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers
from worker.engine.trial_state import TrialState, merge_trial_keys
from worker.engine.units import ShardUnits

__all__ = ["TrialSession", "UnitResult", "trial_create"]  # the session API in one import (trial_create: see create)


@dataclass(frozen=True, kw_only=True)
class UnitResult:
    """What one unit did. Step metrics are set on the unit that completes a step's backward; eval
    metrics on the unit that completes an evaluation. ``peak_device_bytes`` is ``None`` on CPU. ``io_s`` is
    the part of ``seconds`` the unit spent moving its state between the device and the spill store
    (reading, waiting for prefetched reads, writing, committing) rather than computing."""

    unit: UnitSpec
    seconds: float
    bytes_read: int
    bytes_written: int
    peak_device_bytes: int | None
    io_s: float = 0.0
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None
    eval_loss: float | None = None
    eval_ppl: float | None = None
    eval_bpb: float | None = None  # bits per byte of the evaluation (None: the data has no token byte counts)
    eval_tokens: int | None = None  # tokens the evaluation predicted
    eval_bytes: int | None = None  # their UTF-8 bytes
    final_step: int | None = None  # set on the final evaluation (on the held-out set): the steps trained
    # A DPO trial's (TRL's rewards/*): on a step, the means over its batch's pairs of the chosen and rejected
    # answers' implicit rewards and the share of pairs whose chosen reward is the higher; on an evaluation, the
    # same over its pairs and the margin (chosen less rejected); its eval_loss is the mean pair loss, eval_ppl
    # and eval_bpb are the chosen answers'.
    rewards_chosen: float | None = None
    rewards_rejected: float | None = None
    reward_accuracy: float | None = None
    eval_rewards_chosen: float | None = None
    eval_rewards_rejected: float | None = None
    eval_reward_margin: float | None = None
    eval_reward_accuracy: float | None = None
    stopped_early: bool = False
    pruned: str | None = None  # why the trial's stop rule ended it at this evaluation (then stopped_early too)


class TrialSession(ShardUnits):
    """One trial opened from its spill directory; runs its units one at a time, in any process.

    The session holds no training state of its own beyond caches: everything that matters is committed
    in the store after each unit, and every call first picks up commits made elsewhere, so sessions of
    the same trial in different processes are interchangeable (as long as only one runs a unit at a time).
    ``state`` is the working copy of the store's trial state: edited by a unit, published by its commit.
    """

    def __init__(self, store: SpillStore, device: torch.device) -> None:
        self.store = store
        self.device = device
        self.state = TrialState.of(store)
        self.trial_id = self.state.trial_id
        self.spec = self.state.spec
        self.stack = build_layer_stack(self.spec.model, self.spec.lora)
        if self.state.base is not None:
            self.base_root = shared_base.base_root(store.root.parent, self.state.base)
            if not (self.base_root / shared_base.INDEX).exists():  # the host's memory tier was wiped
                assert self.spec.model.pretrained_dir is not None, "a LoRA trial has one"
                shared_base.reacquire(spill_dir=store.root.parent, stack=self.stack, trial_id=self.trial_id,
                                      pretrained_dir=Path(self.spec.model.pretrained_dir), key=self.state.base,
                                      base_dtype=self.spec.model.base_dtype)
        self.data = trial_data(self.spec.data, vocab_size=self.stack.config.vocab_size)
        self._rng_numel = [state.numel() for state in rng_state(device)]
        self._kept: dict[tuple[int, int, int], KeptGraph] = {}  # (step, micro-batch, shard) -> graph
        # Fault injection for tests of out-of-memory recovery on machines without a GPU: a unit whose
        # shard's planned peak (MemoryPlan.unit_peak_bytes) exceeds this raises torch.OutOfMemoryError
        # just before its commit, as a GPU with that much memory would have. None (always, in production)
        # turns it off.
        self.fault_oom_above_bytes: int | None = None
        # Fault injection at named points of a unit, for crash, fencing and out-of-memory tests (see
        # worker.engine.faults); None (always, in production) turns it off.
        self.fault: Fault | None = None
        # Asked after an evaluation that leaves steps to train, with the steps done and the evaluation's figures
        # (UnitResult's eval_* fields by name): a reason to end the trial there (its experiment's pruner stopped
        # it), or None to go on. The scheduler sets it for a trial of a study (worker.scheduling.pruning); None
        # trains every step.
        self.stop_rule: Callable[[int, Mapping[str, Any]], str | None] | None = None
        self._unit_index = self.state.cursor  # the unit the fault points belong to
        store.before_stage = self._before_stage
        # Staging buffers hold one optimizer-state chunk; whole shards stream through them chunk by chunk.
        self._transfers = Transfers(device, max_numel=optimizer_step.STEP_CHUNK)
        self._adopt_plan()

    def _adopt_plan(self) -> None:
        """Derive everything that depends on the trial's plan; again after the trial was re-planned."""
        self.replans = self.state.replans
        self.plan = self.state.plan
        self.stack.layers[-1].token_chunk = self.plan.head_token_chunk
        self.layout = Layout(self.stack, self.plan)
        self.timetable = self.state.timetable()
        self._transfers.retain({})  # reads of the old plan's buffers will never be taken
        self._kept.clear()

    def reopen(self, store: SpillStore) -> None:
        """Continue from ``store``, a newer view of this trial's directory (another process may have run
        units or re-planned the trial since this session last looked)."""
        self.store = store
        store.before_stage = self._before_stage
        self.state = TrialState.of(store, known=self.state)
        if self.state.replans != self.replans:
            self._adopt_plan()

    def close(self) -> None:
        """Stop the background reader (the scheduler calls it when it drops a cached session)."""
        self._transfers.close()

    @classmethod
    def open(cls, *, spill_dir: Path, trial_id: str, device: torch.device) -> TrialSession:
        """Open the last committed state of trial ``trial_id``; raises ``SpillStoreError`` if absent."""
        return cls(SpillStore.open(Path(spill_dir) / trial_id), device)

    def commit(self, *, unit: int | None = None) -> None:
        """Publish the working state with every buffer staged since the last commit (all or nothing);
        raises ``StaleWriterError`` if another writer took or committed the trial since (a lane's writer merges
        onto other lanes' commits instead, see :class:`~worker.engine.spill_store.SpillStore`). ``unit``: the
        unit this commit completes."""
        self.state.stage_in(self.store)
        version = self.store.commit_version
        self.store.commit(merge_trial_keys, unit=unit)
        if self.store.commit_version != version + 1:  # merged onto other lanes' commits: their state too
            self.state = TrialState.of(self.store, known=self.state)

    # -- the scheduler's view ------------------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """The timetable index of the first unit not committed (``len(timetable)`` once the trial is finished),
        as of the last commit this session read or made; a wavefront may have committed units beyond it."""
        return self.state.cursor

    def next_unit(self) -> UnitSpec | None:
        """The unit :meth:`run_unit` runs without a lane (the first not committed), or ``None`` when the trial
        is finished."""
        self._sync()
        return self._next_unit()

    def _next_unit(self) -> UnitSpec | None:
        cursor = self.state.cursor
        return self.timetable[cursor] if cursor < len(self.timetable) else None

    def remaining_units(self) -> int:
        self._sync()
        return len(self.timetable) - self.state.units_committed

    def lane_unit(self, lane: int) -> UnitSpec | None:
        """The next unit of ``lane`` of the segment in flight (see :class:`~worker.engine.schedule.Segment`) if
        every unit it needs is committed, else None (also when the lane is through, or the trial finished)."""
        self._sync()
        return self._lane_unit(lane)

    def _lane_unit(self, lane: int) -> UnitSpec | None:
        state = self.state
        if state.cursor >= len(self.timetable):
            return None
        segment = self.timetable.segment(state.cursor)
        if not 0 <= lane < segment.lanes:
            return None
        index = next((i for i in range(segment.index(lane, 0), segment.index(lane + 1, 0))
                      if not state.committed(i)), None)
        if index is None or not all(state.committed(i) for i in segment.needs(index)):
            return None
        return self.timetable[index]

    def ready_lanes(self) -> list[int]:
        """The lanes of the segment in flight whose next unit can run now, as of the last commit (units in flight
        elsewhere included), most urgent first (:meth:`~worker.engine.schedule.Segment.urgency`): a trial that
        has more than one may run them on several devices at once, and a device takes the first free one."""
        self._sync()
        if self.state.cursor >= len(self.timetable):
            return []
        segment = self.timetable.segment(self.state.cursor)
        ready = [(lane, unit) for lane in range(segment.lanes) if (unit := self._lane_unit(lane)) is not None]
        return [lane for lane, unit in sorted(ready, key=lambda item: segment.urgency(item[1].index))]

    def _sync(self) -> None:
        """Pick up commits made by other processes since this session last looked (SHARP moves trials)."""
        if self.store.is_current():  # a stat, where reading the manifest costs a parse: units call this often
            return
        on_disk = SpillStore.open(self.store.root)
        if on_disk.commit_version != self.store.commit_version:
            self.reopen(on_disk)

    def keeps_activations(self) -> bool:
        """Whether this session holds forward activations that a coming backward unit will use (another
        process would recompute them)."""
        return bool(self._kept)

    def prefetching(self) -> list[str]:
        """The buffers being read in the background for a coming unit (see :meth:`prefetch`)."""
        return [name for name, _ in self._transfers.pending()]

    def base_read(self, unit: UnitSpec | None) -> tuple[Path, int, int] | None:
        """The shared base layers ``(base root, first, stop)`` that ``unit`` reads: None without LoRA, for
        an optimizer step, or for no unit."""
        if unit is None or not self.stack.adapters or unit.phase == "S":
            return None
        return (self.base_root, *self._base_range(unit))

    def next_base_read(self) -> tuple[Path, int, int] | None:
        """:meth:`base_read` of the next unit; without LoRA, None at once (no look at the store: the scheduler
        asks at every unit)."""
        return self.base_read(self.next_unit()) if self.stack.adapters else None

    def _base_range(self, unit: UnitSpec) -> tuple[int, int]:
        shard = self.plan.shards[unit.shard]
        return shard.first, shard.stop

    def prefetch(self, unit: UnitSpec, *, running: tuple[Path, int, int] | None = None) -> None:
        """Start reading ``unit``'s shard state (parameters; a LoRA trial's base layers but for those of
        ``running``, the base layers of the unit about to run on this device, see :meth:`base_read`) in the
        background, so that :meth:`run_unit` finds it
        loaded.

        Call it for the unit after the one about to run. What it reads is keyed by buffer version, so
        prefetching early is always safe; at worst the read is wasted.
        """
        self._sync()
        if self.stack.adapters and unit.phase != "S":
            BaseCache.prefetch(self.base_root, self.stack, *self._base_range(unit), self.device, running=running)
        name = f"p{unit.shard}"  # the accumulated gradients stream through in chunks (worker.engine.gradients)
        version = self.store.version(name)
        assert version is not None, f"{name} is always in the store when a unit may read it"
        self._transfers.start((name, version), self.store.path(name), self.layout.numel[unit.shard])

    def run_unit(self, *, token: int | None = None, lane: int | None = None) -> UnitResult:
        """Run the next unit (of ``lane``, when given) and commit its outputs (all or nothing).

        ``token`` is the caller's fencing token (the scheduler passes its lease's token; larger is newer):
        the unit first takes the store with it, and its commit is refused if a writer with a newer token
        took the trial meanwhile. With ``lane`` the unit takes only that lane of the trial (see
        :class:`~worker.engine.spill_store.SpillStore`): other lanes' units may run in other processes at the
        same time, and their commits add up. ``None`` is for a trial that only this process runs (no fencing,
        but the commit still refuses if another commit landed since). Raises ``StaleWriterError`` when refused:
        nothing was written and the unit's result must be dropped; also when the unit failed otherwise
        (e.g. a file it read was superseded) after a newer writer took the trial. Raises ``LaneNotReady`` when
        the lane has no unit that can run now. On any exception the session reloads the last commit, so it
        stays usable; the unit re-runs.
        """
        if lane is not None and token is None:
            raise EngineError("a lane's unit runs beside other lanes' units: it needs a fencing token")
        if token is not None:
            self.reopen(SpillStore.take(self.store.root, token, lane=lane))  # also removes orphans, under the lock
        elif not self.store.is_current():  # another process ran units since this session last looked
            self.reopen(SpillStore.open(self.store.root))
        replans = self.state.replans
        # The store just taken is this writer's: no _sync (which would replace it with a reader's copy).
        unit = self._next_unit() if lane is None else self._lane_unit(lane)
        if unit is None and lane is not None and self.state.cursor < len(self.timetable):
            raise LaneNotReady(f"lane {lane} of trial {self.trial_id} has no unit that can run now")
        if unit is None:
            raise EngineError(f"trial {self.trial_id} is finished: no unit left to run")
        if token is None:
            self.store.remove_orphans()  # we are the trial's one writer now
        self.store.pool_share = spill_pool.writer_tag(lane, update=unit.phase == "S")
        self._unit_index = unit.index
        self.reach("before-compute")
        read0, written0 = self.store.bytes_read, self.store.bytes_written
        io0 = self.store.io_s + self._transfers.wait_s
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        run = {"R": self._reference, "F": self._forward, "FB": self._forward_backward, "B": self._backward,
               "E": self._evaluate, "S": self._final_step}[unit.phase]
        for key in [k for k in self._kept if k[0] < unit.step or unit.phase in ("E", "S")]:
            del self._kept[key]  # the backward that would use it ran elsewhere
        try:
            with caller_rng_kept(self.device):
                metrics = run(unit)
            if (self.stop_rule is not None and metrics.get("eval_loss") is not None
                    and not metrics.get("stopped_early") and unit.step < self.spec.total_steps - 1):
                self.state.early_stop.pruned = self.stop_rule(unit.step + 1, metrics)
                metrics["stopped_early"] = self.state.early_stop.pruned is not None
            if self.state.early_stop.pruned is not None:  # this unit and the final evaluation's after it
                metrics["pruned"] = self.state.early_stop.pruned
            limit = self.fault_oom_above_bytes
            if limit is not None and self.plan.unit_peak_bytes(unit.shard) > limit:
                raise torch.OutOfMemoryError(
                    f"fault injection: shard {unit.shard} plans a peak of {self.plan.unit_peak_bytes(unit.shard)} "
                    f"bytes, over the injected device memory of {limit} bytes")
            self.state.mark_committed(unit.index)
            # An early stop ends the timetable here, or goes on to the final evaluation on the declared held-out
            # set when the trial has one: the evaluation has applied every pending update.
            if metrics.get("stopped_early"):
                self.state.skip_to(self.timetable.final_eval_start)
            self.state.last_unit, self.state.last_metrics = unit.index, metrics
            self.reach("before-commit")
            self.commit(unit=unit.index)
            self._transfers.retain(self.store.buffers)
            self.reach("after-commit")
        except BaseException as error:
            mine = self.store
            self.reopen(SpillStore.open(self.store.root))
            self._kept.clear()
            if token is not None and isinstance(error, Exception) and self._superseded(token, lane, replans):
                # A newer writer took the trial while this unit ran, and superseded (deleted) files it was
                # reading: whatever the unit failed with, it could not have committed.
                mine.remove_own_files()
                raise StaleWriterError(
                    f"unit {unit.index} of trial {self.trial_id} failed ({type(error).__name__}: {error}) after a "
                    f"writer with a newer fencing token than {token} took the trial") from error
            raise
        finally:
            self.stack.release(self.plan.shards[unit.shard].first, self.plan.shards[unit.shard].stop)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return UnitResult(
            unit=unit, seconds=time.perf_counter() - start,
            bytes_read=self.store.bytes_read - read0, bytes_written=self.store.bytes_written - written0,
            io_s=self.store.io_s + self._transfers.wait_s - io0,
            peak_device_bytes=torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None,
            **metrics,
        )

    def export(self, out_dir: Path) -> None:
        """Write the committed weights as a transformers ``save_pretrained`` directory (safetensors; see
        :mod:`worker.engine.export`), with the trial's tokenizer when its data names one. Weights of a step
        whose update is still pending (mid-trial) are exported as they were before that step."""
        self._unit_index = self.state.cursor
        tokenizer_dir = self.spec.data.tokenizer_dir
        if self.spec.lora is not None:
            export_lora(out_dir, store=self.store, stack=self.stack, layout=self.layout, spec=self.spec.lora,
                        base_dir=self.spec.model.pretrained_dir, base_root=self.base_root,
                        tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
                        chat_template=self.spec.data.chat_template, after_file=lambda: self.reach("mid-export"))
            return
        export_pretrained(out_dir, store=self.store, stack=self.stack, layout=self.layout,
                          tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
                          chat_template=self.spec.data.chat_template, after_file=lambda: self.reach("mid-export"))

    def _superseded(self, token: int, lane: int | None, replans: int) -> bool:
        """Whether, as last committed, a writer with a newer token than ``token`` took the trial, or ``lane`` of it,
        or the trial was re-planned since it had ``replans`` re-plans (by a unit of another lane, which ran out
        of memory: its re-plan dropped the buffers of this one's segment)."""
        if self.store.fence > token or self.state.replans != replans:
            return True
        held = self.store.manifest.get("lanes", {}).get(str(lane)) if lane is not None else None
        return held is not None and held["token"] > token

    def reach(self, point: str) -> None:
        """Fault point `point` (a name of `worker.engine.faults.POINTS`) of the current unit."""
        if self.fault is not None:
            self.fault.reach(point, trial_id=self.trial_id, unit=self._unit_index)

    def _before_stage(self, staged: int) -> None:
        self.reach("mid-write" if staged else "before-write")

    # -- between two steps (re-planning) ------------------------------------------------------------

    def apply_pending_steps(self) -> None:
        """Apply every shard's pending optimizer update, staging its new parameters and optimizer state
        (:meth:`commit` publishes them); shards without one are left as they are."""
        with caller_rng_kept(self.device):
            for shard in range(len(self.plan.shards)):
                self._load_shard(shard)


