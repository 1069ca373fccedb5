"""Trials as resumable sequences of shard units whose whole state lives in the spill store.

``TrialSession.open`` picks a trial created by :func:`~worker.engine.create.trial_create` up in any
process, and each ``run_unit`` runs the next unit of the timetable (:mod:`worker.engine.schedule`) and
commits its outputs together with the advanced cursor. A unit killed half-way leaves the previous commit,
and re-running it gives identical numbers because the RNG state is part of the store.

Spill buffer names (per trial directory)::

    p{s} g{s}        shard s: flat fp32 parameters and accumulated gradients
    m{s} v{s}        shard s: optimizer state (AdamW exp_avg and exp_avg_sq; SGD momentum in m)
    t{s}             shard s: gradients of parameters it borrows from another shard (tied weights)
    a{m}.{s} d{m}.{s} output of shard s for micro-batch m, and the loss gradient w.r.t. it
    r{m}.{s}         RNG state before shard s ran forward on micro-batch m (replayed by the recompute)
    rng              the trial's RNG stream (dropout of plain training, unit after unit)
    rs               the RNG stream as the current step started (to roll the step back, see repartition)
    e{s}             output of shard s for the current evaluation batch

The small state next to them (cursor, per-shard flags, running sums) is a
:class:`~worker.engine.trial_state.TrialState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.engine import optimizer_step, shared_base
from worker.engine.activations import KeptGraph
from worker.engine.create import trial_create
from worker.engine.data import trial_data
from worker.engine.errors import EngineError, StaleWriterError
from worker.engine.export import export_lora, export_pretrained
from worker.engine.faults import Fault
from worker.engine.layers import build_layer_stack
from worker.engine.layout import Layout
from worker.engine.rng import caller_rng_kept, rng_state
from worker.engine.schedule import Timetable, UnitSpec
from worker.engine.shared_base import BaseCache
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers
from worker.engine.trial_state import TrialState
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
        # Asked after an evaluation that leaves steps to train, with the steps done and the validation loss:
        # a reason to end the trial there (its experiment's pruner stopped it), or None to go on. The scheduler
        # sets it for a trial of a study (worker.scheduling.pruning); None trains every step.
        self.stop_rule: Callable[[int, float], str | None] | None = None
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
        self.timetable = Timetable.of(self.spec, shards=len(self.plan.shards))
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

    def commit(self) -> None:
        """Publish the working state with every buffer staged since the last commit (all or nothing);
        raises ``StaleWriterError`` if another writer took or committed the trial since."""
        self.state.stage_in(self.store)
        self.store.commit()

    # -- the scheduler's view ------------------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """The timetable index of the next unit to run (``len(timetable)`` once the trial is finished), as
        of the last commit this session read or made."""
        return self.state.cursor

    def next_unit(self) -> UnitSpec | None:
        """The unit :meth:`run_unit` would run, or ``None`` when the trial is finished."""
        self._sync()
        cursor = self.state.cursor
        return self.timetable[cursor] if cursor < len(self.timetable) else None

    def remaining_units(self) -> int:
        self._sync()
        return len(self.timetable) - self.state.cursor

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

    def run_unit(self, *, token: int | None = None) -> UnitResult:
        """Run the next unit and commit its outputs with the advanced cursor (all or nothing).

        ``token`` is the caller's fencing token (the scheduler passes its lease's token; larger is newer):
        the unit first takes the store with it, and its commit is refused if a writer with a newer token
        took the trial meanwhile. ``None`` is for a trial that only this process runs (no fencing, but
        the commit still refuses if another commit landed since). Raises ``StaleWriterError`` when refused:
        nothing was written and the unit's result must be dropped; also when the unit failed otherwise
        (e.g. a file it read was superseded) after a newer writer took the trial. On any exception the
        session reloads the last commit, so it stays usable; the unit re-runs.
        """
        if token is not None:
            self.reopen(SpillStore.take(self.store.root, token))  # also removes orphans, under the lock
        unit = self.next_unit()
        if unit is None:
            raise EngineError(f"trial {self.trial_id} is finished: no unit left to run")
        if token is None:
            self.store.remove_orphans()  # we are the trial's one writer now
        self._unit_index = unit.index
        self.reach("before-compute")
        read0, written0 = self.store.bytes_read, self.store.bytes_written
        io0 = self.store.io_s + self._transfers.wait_s
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        run = {"F": self._forward, "FB": self._forward_backward, "B": self._backward,
               "E": self._evaluate, "S": self._final_step}[unit.phase]
        for key in [k for k in self._kept if k[0] < unit.step or unit.phase in ("E", "S")]:
            del self._kept[key]  # the backward that would use it ran elsewhere
        try:
            with caller_rng_kept(self.device):
                metrics = run(unit)
            if (self.stop_rule is not None and metrics.get("eval_loss") is not None
                    and not metrics.get("stopped_early") and unit.step < self.spec.total_steps - 1):
                self.state.early_stop.pruned = self.stop_rule(unit.step + 1, metrics["eval_loss"])
                metrics["stopped_early"] = self.state.early_stop.pruned is not None
            if self.state.early_stop.pruned is not None:  # this unit and the final evaluation's after it
                metrics["pruned"] = self.state.early_stop.pruned
            limit = self.fault_oom_above_bytes
            if limit is not None and self.plan.unit_peak_bytes(unit.shard) > limit:
                raise torch.OutOfMemoryError(
                    f"fault injection: shard {unit.shard} plans a peak of {self.plan.unit_peak_bytes(unit.shard)} "
                    f"bytes, over the injected device memory of {limit} bytes")
            # An early stop ends the timetable here, or goes on to the final evaluation on the declared held-out
            # set when the trial has one: the evaluation has applied every pending update.
            self.state.cursor = self.timetable.final_eval_start if metrics.get("stopped_early") else unit.index + 1
            self.state.last_unit, self.state.last_metrics = unit.index, metrics
            self.reach("before-commit")
            self.commit()
            self._transfers.retain(self.store.buffers)
            self.reach("after-commit")
        except BaseException as error:
            mine = self.store
            self.reopen(SpillStore.open(self.store.root))
            self._kept.clear()
            if token is not None and self.store.fence > token and isinstance(error, Exception):
                # A newer writer took the trial while this unit ran, and superseded (deleted) files it was
                # reading: whatever the unit failed with, it could not have committed.
                mine.remove_own_files()
                raise StaleWriterError(
                    f"unit {unit.index} of trial {self.trial_id} failed ({type(error).__name__}: {error}) after a "
                    f"writer with fencing token {self.store.fence} took the trial from token {token}") from error
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

    def rewind_rng_to_step_start(self) -> None:
        """Stage the trial's RNG stream as it was when the current step's first unit ran (``rs``)."""
        self.store.write("rng", self.store.read_new("rs", sum(self._rng_numel), torch.uint8))
