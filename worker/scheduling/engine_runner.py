"""Runs `worker.engine` trials for a device loop: plan into the host's spill directory, run units, export.

Its job is `worker.contract.EngineJob`. The engine keeps a trial's whole state in its
spill store; a session adds only structures derived from the trial's spec and plan (layer stack, layout,
data), which cost tens of milliseconds to build, as much as a small unit. So the sessions of recent
trials are kept, and each unit gives its session the store freshly opened from disk, which another device
may have advanced since (the engine's own recovery after a failed unit does the same).

A unit that runs out of device memory re-plans its trial: the partitioner's estimates can be low (the
paper's are known to be), and fragmentation or another process can take memory the plan counted on. The
trial is re-partitioned under ``REPLAN_FACTOR`` of its budget (`worker.engine.repartition`: the step in
flight is rolled back, so the numbers stay those of plain training) and goes back to the queue with its new
plan. When even a single layer cannot fit the smaller budget, the trial fails with both reasons.

Durable checkpoints (`worker.engine.durable`): after a unit, once the job's ``checkpoint_minutes`` have
passed since the trial's last checkpoint (or since its store was made), the runner snapshots the trial's
commit (hard links, between two units) and a background thread copies it to ``checkpoint_dir`` one file at
a time while units go on; a finished trial's last commit is checkpointed as its store is freed, before the
trial is reported finished. A trial whose store is gone (the host restarted, and ``/dev/shm`` with it) is
restored from its last checkpoint and goes on from there; one without a checkpoint fails with the reason.
Each checkpoint written is reported once through `checkpoints` (the device loop sends them to the telemetry
stream).

A LoRA trial's units read its shared frozen base (`worker.engine.shared_base`) through the process's base
cache. Each unit done says which base layers it read and which its trial's next unit reads, for the
policy's base affinity; prefetching a coming unit leaves out the base layers the unit about to run loads.

A trial the queue lost (Redis emptied) is submitted again and planned again: planning takes up its
committed store, so it goes on from that store's last commit, exactly. A trial whose store is gone (the
host rebooted) is restored from its last checkpoint, or fails saying so (`EngineRunner._store_gone`).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import torch

from worker.contract import EngineJob, LeaseLost
from worker.engine import durable, shared_base
from worker.engine.durable import CheckpointInfo, Snapshot
from worker.engine.errors import BudgetError, LaneNotReady, SpecError, SpillStoreError, StaleWriterError
from worker.engine.faults import Fault
from worker.engine.partition import AUTO_BUDGET_FRACTION
from worker.engine.repartition import repartition
from worker.engine.session import TrialSession, UnitResult, trial_create
from worker.engine.spill_store import SpillStore
from worker.scheduling import pruning
from worker.scheduling.runner import LaneBusy, Planned, Replanned, UnitDone, WorkloadError
from worker.scheduling.telemetry import CheckpointMetrics
from worker.scheduling.unit_records import _shard_of, first_unit_estimate, progress_of, unit_done

log = logging.getLogger(__name__)

SESSION_CACHE = 8
REPLAN_FACTOR = 0.75  # a trial that ran out of memory is re-planned under this share of its budget


def device_budget_bytes(device: torch.device, fallback: int) -> int:
    """The memory budget "auto" means on `device`, decided where the device is (the web host may see no
    GPU at all): 90% of what this process can have of the GPU now, its free memory plus what PyTorch's
    allocator already holds. A CPU device has no such number: `fallback` (the budget the trial came with)."""
    if device.type != "cuda":
        return fallback
    free, _ = torch.cuda.mem_get_info(device)
    return int(AUTO_BUDGET_FRACTION * (free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)))


def torch_device(kind: str) -> torch.device:
    """The torch device of a worker pinned to one device: a CUDA worker sees only its GPU, as cuda:0."""
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


class EngineRunner:
    """Engine trials under `spill_dir` on `device` (this process's only device)."""

    def __init__(self, *, spill_dir: Path, device: torch.device, prefetch: bool = True,
                 checkpoint_dir: Path | None = None, fault_oom_above_bytes: int | None = None,
                 fault: Fault | None = None, studies: redis.Redis | None = None,
                 host_cores: Collection[int] | None = None) -> None:
        """`prefetch`: load the next unit's shard in the background (the double buffer); off where there is
        nothing to overlap with, as on a CPU device of one core. `checkpoint_dir`: where durable checkpoints
        go (None: none are taken or restored). `host_cores`: the cores the checkpoint copies may run on, where
        this process is pinned to its CPU device's cores: a copy is host work, and confined to the device's
        core it would take that core from the device's units (and from the export at a trial's end, which waits
        for it) while another core may idle. `fault_oom_above_bytes` and `fault` are
        fault injection for tests (see `TrialSession.fault_oom_above_bytes` and `TrialSession.fault`).
        `studies`: the Redis holding the pruners' studies (`worker.scheduling.pruning`); a job with pruning
        needs it."""
        self.spill_dir = spill_dir
        self.device = device
        self.prefetch = prefetch
        self.checkpoint_dir = checkpoint_dir
        self.fault_oom_above_bytes = fault_oom_above_bytes
        self.fault = fault
        self.studies = studies
        self._sessions: OrderedDict[str, TrialSession] = OrderedDict()
        self._checkpointed: dict[str, float] = {}  # trial -> time of its last checkpoint known here (or start)
        self._writer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hydra-checkpoint",
            initializer=(lambda: os.sched_setaffinity(0, host_cores)) if host_cores else None,
        )
        self._written: list[CheckpointMetrics] = []  # checkpoints written, not yet taken by `checkpoints`
        self._written_lock = threading.Lock()
        if checkpoint_dir is not None:  # a worker killed while writing a checkpoint left its links in host RAM
            durable.sweep_snapshots(spill_dir=spill_dir, checkpoint_dir=checkpoint_dir)

    def plan(self, *, trial_id: str, job: EngineJob) -> Planned:
        """Plan a new trial, or take up the state of one planned before.

        A committed store of the trial is its state: the queue lost the trial (Redis emptied) and it was
        submitted again, or planning died after making the store. The trial goes on from that store's last
        commit. A trial submitted again to resume (`EngineJob.resume`) whose store is gone is restored from
        its last checkpoint or fails with the reason (`_store_gone`). A store made for another spec (a
        trial id used again: the database was replaced, the host's stores were not) is not this trial's."""
        if SpillStore.exists(self.spill_dir / trial_id):
            if self._holds(trial_id, job):
                return self._resumed(trial_id)
            log.warning("trial %s: its spill store holds another trial's state; deleting it", trial_id)
            self.discard(trial_id=trial_id)
        if job.continue_from is not None and not (job.resume and self._has_checkpoint(trial_id)):
            self._continue(trial_id, job)
            return self._resumed(trial_id)
        if job.resume:
            self._store_gone(trial_id, job)
            return self._resumed(trial_id)
        trial = job.trial
        if job.budget == "auto":
            trial = dataclasses.replace(trial, budget_bytes=device_budget_bytes(self.device, trial.budget_bytes))
        # A planning attempt that died half-way left a partial store; planning owns the directory.
        shutil.rmtree(self.spill_dir / trial_id, ignore_errors=True)
        if job.pruning is not None:  # trained afresh (a retry): what the study held of it is no longer so
            pruning.restart(self._studies(), job.pruning)
        plan = trial_create(spec=trial, spill_dir=self.spill_dir, trial_id=trial_id, device=self.device)
        session = self._open(trial_id)
        return Planned(remaining_units=session.remaining_units(), unit_s=first_unit_estimate(plan),
                       plan=plan.to_dict(), ready=session.ready_lanes(), ready_version=session.store.commit_version)

    def _holds(self, trial_id: str, job: EngineJob) -> bool:
        """Whether the trial's committed store was made for `job`'s spec (whatever memory budget it got)."""
        spec = self._open(trial_id).spec
        return dataclasses.replace(spec, budget_bytes=job.trial.budget_bytes) == job.trial

    def _resumed(self, trial_id: str) -> Planned:
        """The queue's view of a trial that goes on from its committed store. Its last committed unit counts
        as not yet reported (units_done one short, one more unit left): whether its report reached the queue
        before the queue lost the trial cannot be known, and reporting it again is idempotent, so the first
        unit its lane runs is that report (`_committed_unreported`), with the metrics it committed."""
        session = self._open(trial_id)
        left, done = session.remaining_units(), session.state.units_committed
        last, expired = session.state.last_unit, None
        if last >= 0:
            lane = session.timetable.segment(last).place(last)[0]
            held = session.store.manifest.get("lanes", {}).get(str(lane), {})
            if held.get("unit") == last:
                left, done, expired = left + 1, done - 1, (lane, int(held["token"]))
        log.warning("trial %s resumes from its spill store at unit %d of %d", trial_id, session.cursor,
                    len(session.timetable))
        ready = session.ready_lanes()
        if expired is not None and expired[0] not in ready:
            ready = sorted({*ready, expired[0]})
        return Planned(remaining_units=left, unit_s=first_unit_estimate(session.plan), plan=session.plan.to_dict(),
                       units_done=done, ready=ready, ready_version=session.store.commit_version, expired=expired)

    def _has_checkpoint(self, trial_id: str) -> bool:
        return self.checkpoint_dir is not None and durable.latest(self.checkpoint_dir, trial_id) is not None

    def _continue(self, trial_id: str, job: EngineJob) -> CheckpointInfo:
        """Make the store of a trial that continues the ended trial `job.continue_from` from that trial's last
        checkpoint (`worker.engine.durable.continue_from_checkpoint`), or raise WorkloadError saying why not."""
        assert job.continue_from is not None
        self._drop(trial_id)
        shutil.rmtree(self.spill_dir / trial_id, ignore_errors=True)  # what a planning that died half-way left
        if self.checkpoint_dir is None:
            raise WorkloadError(f"trial {trial_id} continues trial {job.continue_from} from its checkpoint, and this "
                                "worker keeps no checkpoints")
        try:
            info = durable.continue_from_checkpoint(checkpoint_dir=self.checkpoint_dir, spill_dir=self.spill_dir,
                                                    source_id=job.continue_from, trial_id=trial_id, spec=job.trial)
        except (SpecError, SpillStoreError) as error:
            raise WorkloadError(f"trial {trial_id} cannot continue trial {job.continue_from}: {error}") from None
        session = self._open(trial_id)
        if session.state.base is not None:  # a LoRA trial: count it as a user of its shared base on this host
            assert job.trial.model.pretrained_dir is not None, "a LoRA trial has one"
            shared_base.reacquire(spill_dir=self.spill_dir, stack=session.stack, trial_id=trial_id,
                                  pretrained_dir=Path(job.trial.model.pretrained_dir), key=session.state.base)
        log.warning("trial %s continues trial %s from its checkpoint of step %d (%s)", trial_id, job.continue_from,
                    info.step, info.path)
        return info

    def _store_gone(self, trial_id: str, job: EngineJob | None = None) -> CheckpointInfo:
        """Bring back the store of a trial that trained before from its last checkpoint (a continuing trial
        without one of its own: from the checkpoint it continues), or raise WorkloadError saying why it cannot
        go on (the trial then fails, and the web app offers to retry it)."""
        self._drop(trial_id)
        info = None
        if self.checkpoint_dir is not None:
            info = durable.restore_from_checkpoint(checkpoint_dir=self.checkpoint_dir, spill_dir=self.spill_dir,
                                                   trial_id=trial_id)
        if info is None and job is not None and job.continue_from is not None:
            return self._continue(trial_id, job)
        if info is None:
            raise WorkloadError(f"the spill store of trial {trial_id} is gone (host restarted?) and it has no "
                                "checkpoint")
        log.warning("trial %s: its spill store was gone; restored from its checkpoint of step %d (%s)",
                    trial_id, info.step, info.path)
        self._checkpointed[trial_id] = info.time
        return info

    def run_unit(self, *, trial_id: str, job: EngineJob, units_done: int, next_trial: str | None,
                 token: int, lane: int | None = None, expired: str = "") -> UnitDone | Replanned:
        """Run the next unit of the trial's `lane` (None: its next unit in timetable order, the whole trial taken),
        fenced by `token` (see `TrialRunner.run_unit`). When its store vanished (the host's spill directory was
        wiped) before or during the unit, the store is restored from the trial's last checkpoint and the next unit
        from there runs instead (`_store_gone`)."""
        unit = functools.partial(self._run_unit, trial_id=trial_id, job=job, next_trial=next_trial, token=token,
                                 lane=lane, expired=expired)
        try:
            return unit()
        except (OSError, SpillStoreError) as error:
            if isinstance(error, StaleWriterError) or SpillStore.exists(self.spill_dir / trial_id):
                raise
            log.warning("trial %s: its spill store vanished (%s: %s)", trial_id, type(error).__name__, error)
        self._store_gone(trial_id, job)
        return unit()

    def _run_unit(self, *, trial_id: str, job: EngineJob, next_trial: str | None, token: int, lane: int | None,
                  expired: str) -> UnitDone | Replanned:
        if not SpillStore.exists(self.spill_dir / trial_id):  # the host lost it (rebooted, /dev/shm wiped)
            self._drop(trial_id)
            self._store_gone(trial_id, job)
        session = self._open(trial_id)
        unreported = session.store.lane_committed(lane, int(expired)) if expired and lane is not None else None
        if unreported is not None:
            assert lane is not None
            return self._committed_unreported(trial_id, session, token, lane, unreported)
        if not self.prefetch:
            next_trial = None
        session.stop_rule = None if job.pruning is None else functools.partial(self._ask_pruner, trial_id, job)
        coming = session.next_unit() if lane is None else session.lane_unit(lane)
        running = session.base_read(coming)
        if next_trial == trial_id:
            if coming is not None and coming.index + 1 < len(session.timetable):
                session.prefetch(session.timetable[coming.index + 1], running=running)
        elif next_trial is not None:
            self._prefetch_other(next_trial, running)
        try:
            result = session.run_unit(token=token, lane=lane)
        except StaleWriterError as error:
            raise LeaseLost(f"trial {trial_id!r}: {error}") from error
        except LaneNotReady as error:
            raise LaneBusy(str(error), *progress_of(session)) from error
        except torch.OutOfMemoryError as error:
            reason = str(error).split("\n")[0]  # CUDA's message goes on about allocator settings
        else:
            left = session.remaining_units()
            if left:
                self._checkpoint_if_due(trial_id, job)
            rung = None
            if job.pruning is not None and not left:
                if result.pruned is None:
                    pruning.finish(self._studies(), job.pruning, loss=job.pruning.pruner.value(vars(result)),
                                   step=result.final_step if result.final_step is not None else result.unit.step + 1)
                else:
                    rung = pruning.rung_of(self._studies(), job.pruning)
            return unit_done(trial_id, result, *progress_of(session), keeps=session.keeps_activations(),
                             base=_shard_of(running), next_base=_shard_of(session.next_base_read()), rung=rung)
        # Outside the except block: its traceback holds the failed unit's frames and their device tensors.
        del session
        return self._replan(trial_id, reason, token)

    def _studies(self) -> redis.Redis:
        if self.studies is None:
            raise WorkloadError("this worker was started without the Redis of the pruners' studies")
        return self.studies

    def _ask_pruner(self, trial_id: str, job: EngineJob, step: int, figures: Mapping[str, Any]) -> str | None:
        """The session's stop rule for a trial of a study: report the evaluation's figure of the pruner's metric,
        end the trial if pruned (an evaluation without that figure goes on)."""
        assert job.pruning is not None
        value = job.pruning.pruner.value(figures)
        if value is None:
            return None
        verdict = pruning.report(self._studies(), job.pruning, step=step, loss=value)
        return verdict.reason if verdict.prune else None

    def _checkpoint_if_due(self, trial_id: str, job: EngineJob) -> None:
        """Snapshot the trial for a checkpoint written in the background if the job's interval has passed
        since its last one (otherwise a clock read and a dictionary lookup per unit)."""
        interval = job.checkpoint_minutes * 60
        if self.checkpoint_dir is None or interval <= 0:
            return
        now = time.time()
        since = self._checkpointed.get(trial_id)
        if since is not None and now - since < interval:
            return
        newest = durable.latest(self.checkpoint_dir, trial_id)  # another device may have taken one since
        if newest is not None:
            since = newest.time
        elif since is None:  # this process has not seen the trial before: count from when its store was made
            try:
                since = os.stat(self.spill_dir / trial_id / "manifest.lock").st_mtime
            except OSError:
                since = now
        self._checkpointed[trial_id] = since
        if now - since >= interval:
            self._start_checkpoint(trial_id)

    def _start_checkpoint(self, trial_id: str) -> None:
        held = self._snapshot(trial_id)
        if held is not None:
            self._checkpointed[trial_id] = held.time
            self._writer.submit(self._write, held)

    def _snapshot(self, trial_id: str, *, wait: bool = False) -> Snapshot | None:
        assert self.checkpoint_dir is not None
        try:
            return durable.snapshot(spill_dir=self.spill_dir, checkpoint_dir=self.checkpoint_dir, trial_id=trial_id,
                                    wait=wait)
        except (OSError, SpillStoreError) as error:  # a checkpoint missed is not worth failing the trial for
            log.warning("trial %s: no checkpoint taken: %s", trial_id, error)
            return None

    def _write(self, held: Snapshot) -> None:
        """The background half of a checkpoint (`worker.engine.durable.Snapshot.write`)."""
        try:
            info = held.write()
        except Exception:  # the trial goes on; its next checkpoint is due at once
            log.exception("checkpoint of trial %s at step %d failed", held.trial_id, held.step)
            self._checkpointed.pop(held.trial_id, None)
            return
        with self._written_lock:
            self._written.append(CheckpointMetrics(trial=info.trial_id, step=info.step, time=info.time,
                                                   bytes=info.bytes))

    def checkpoints(self) -> list[CheckpointMetrics]:
        """The checkpoints written since the last call, each reported once."""
        with self._written_lock:
            written, self._written = self._written, []
        return written

    def wait_for_checkpoints(self) -> None:
        """Block until every checkpoint started so far is written (tests, benchmarks, shutdown)."""
        self._writer.submit(lambda: None).result()

    def _committed_unreported(self, trial_id: str, session: TrialSession, token: int, lane: int,
                              index: int) -> UnitDone:
        """Unit `index` of `lane` was committed and never reported: the device that ran it died after its commit
        (or, after the trial's last unit, while exporting). Report that unit done in its place, with the
        metrics it committed (kept for the trial's last committed unit), so that its step's loss is not lost and
        the queue's count is right again; the lane then goes on with its next unit, or the device exports the
        trial."""
        try:
            # fenced like a unit of the lane: one device reports it
            session.reopen(SpillStore.take(self.spill_dir / trial_id, token, lane=lane))
        except StaleWriterError as error:
            raise LeaseLost(f"trial {trial_id!r}: {error}") from error
        state = session.state
        log.warning("trial %s: unit %d was committed by a device that did not report it; reporting it now",
                    trial_id, index)
        metrics = state.last_metrics if state.last_unit == index else {}
        result = UnitResult(unit=session.timetable[index], seconds=0.0, bytes_read=0, bytes_written=0,
                            peak_device_bytes=None, **metrics)
        return unit_done(trial_id, result, *progress_of(session))

    def _replan(self, trial_id: str, reason: str, token: int) -> Replanned:
        dropped = self._drop(trial_id)  # the session's caches belong to the old plan
        assert dropped is not None, "run_unit opened it"
        # Two devices running micro-batches of one trial may both run out of memory: the first to re-plan does it
        # for both (and ends the other's lease); the other's re-plan, from the old plan, is refused.
        old, seen = dropped.plan, dropped.state.replans
        del dropped
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        budget = int(old.budget_bytes * REPLAN_FACTOR)
        log.warning("trial %s ran out of memory (%s); re-planning under %d bytes", trial_id, reason, budget)
        try:
            plan = repartition(spill_dir=self.spill_dir, trial_id=trial_id, device=self.device,
                               budget_bytes=budget, token=token, replans=seen)
        except StaleWriterError as error:
            raise LeaseLost(f"trial {trial_id!r}: {error}") from error
        except BudgetError as error:
            raise WorkloadError(f"out of device memory ({reason}), and no smaller plan exists: {error}") from None
        message = (f"re-planned after out-of-memory: {len(old.shards)} -> {len(plan.shards)} shards, budget "
                   f"{old.budget_bytes / 2**20:.1f} -> {budget / 2**20:.1f} MiB ({reason})")
        session = self._open(trial_id)
        return Replanned(remaining_units=session.remaining_units(), unit_s=first_unit_estimate(plan),
                         plan=plan.to_dict(), message=message, ready=session.ready_lanes(),
                         ready_version=session.store.commit_version)

    def export(self, *, trial_id: str, job: EngineJob, export_dir: str) -> None:
        """Export the model directory, then delete the trial's spill store (host RAM on /dev/shm); with
        checkpoints on, its last commit is checkpointed too, before this returns, so that the trial is reported
        finished with it on disk and its host memory freed. The checkpoint is copied on the checkpoint writer's
        thread while this one exports: both only read the committed store, and a trial's end then waits for the
        longer of the two rather than their sum (the snapshot's links hold each file until it is copied, so the
        store can go before the copy is done)."""
        session = self._open(trial_id)
        end = len(session.timetable)
        written = None
        if self.checkpoint_dir is not None and job.checkpoint_minutes > 0:
            held = self._snapshot(trial_id, wait=True)  # after a periodic one still being written
            written = self._writer.submit(self._write, held) if held is not None else None
        session.export(Path(export_dir))
        self._drop(trial_id)
        self._checkpointed.pop(trial_id, None)
        shutil.rmtree(self.spill_dir / trial_id)
        shared_base.release_trial(spill_dir=self.spill_dir, trial_id=trial_id)
        if written is not None:
            written.result()
        if job.continue_from is not None and self.checkpoint_dir is not None:
            newest = durable.latest(self.checkpoint_dir, trial_id)
            if newest is not None and newest.cursor >= end:  # the state it continued is superseded on disk
                durable.delete_checkpoints(self.checkpoint_dir, job.continue_from)

    def discard(self, *, trial_id: str) -> None:
        """Delete the trial's spill store, if this host has one, and its checkpoints (it ended cancelled or
        failed: nothing of it runs again)."""
        self._drop(trial_id)
        self._checkpointed.pop(trial_id, None)
        shutil.rmtree(self.spill_dir / trial_id, ignore_errors=True)
        shared_base.release_trial(spill_dir=self.spill_dir, trial_id=trial_id)
        # What a process killed while checkpointing or restoring the trial left beside the stores (host RAM).
        shutil.rmtree(self.spill_dir / durable.SNAPSHOTS / trial_id, ignore_errors=True)
        shutil.rmtree(self.spill_dir / f"{durable.RESTORING}{trial_id}", ignore_errors=True)
        if self.checkpoint_dir is not None:
            self.wait_for_checkpoints()  # a checkpoint of it being written would leave its files behind
            durable.delete_checkpoints(self.checkpoint_dir, trial_id)

    def _open(self, trial_id: str) -> TrialSession:
        """The trial's session, on its last commit (read again only if a commit landed since)."""
        session = self._sessions.pop(trial_id, None)
        if session is None:
            session = TrialSession(SpillStore.open(self.spill_dir / trial_id), self.device)
            session.fault_oom_above_bytes = self.fault_oom_above_bytes
            session.fault = self.fault
        elif not session.store.is_current():
            session.reopen(SpillStore.open(self.spill_dir / trial_id))
        self._sessions[trial_id] = session
        while len(self._sessions) > SESSION_CACHE:
            self._sessions.popitem(last=False)[1].close()
        return session

    def _drop(self, trial_id: str) -> TrialSession | None:
        """Forget the trial's cached session and stop its background reader."""
        session = self._sessions.pop(trial_id, None)
        if session is not None:
            session.close()
        return session

    def _prefetch_other(self, trial_id: str, running: tuple[Path, int, int] | None) -> None:
        """Prefetch another trial's next unit, if this process has its session (building one costs a unit);
        `running`: the base layers the unit about to run reads (the other trial's unit needs no read of them).

        Another device may be running that trial's unit right now: opening the store only reads its last
        commit (it touches no file), and the reads are keyed by buffer version, so if that device commits
        first they are simply not used.
        """
        session = self._sessions.get(trial_id)
        if session is None:
            return
        try:
            if not session.store.is_current():
                session.reopen(SpillStore.open(self.spill_dir / trial_id))
            unit = session.next_unit()
            if unit is not None:
                session.prefetch(unit, running=running)
        except (OSError, ValueError, KeyError, SpillStoreError) as error:  # the trial moved on or ended
            log.debug("prefetch of trial %s skipped: %s", trial_id, error)
