"""What a device worker runs: claim the next unit by Sharded-LRTF, run it under a lease, record it, repeat.

One loop per device (the worker's ``device_loop`` task). A unit costs one Redis round trip, or two: one
pipeline completes the unit, writes its telemetry and makes the next turn's survey (requeue expired
leases, read candidates); then a claim of the trial the policy picked. While the device holds the trial
(its process keeps the activations of the micro-batch in flight), the completion leases the trial's next
unit at once, as the policy would pick it anyway, and the claim is skipped: 6 units in 7 on a 4-shard
trial. Otherwise the survey's script also claims the trial the loop guesses its policy will pick (the
policy applied to the survey this unit was chosen from, with this trial as the unit left it): the policy,
applied to the new survey, confirms the guess, and the unit needs no round trip of its own; or it refuses
it, and one round trip gives the trial back as it was (`ShardQueue.unclaim_then_claim`) and claims the
policy's choice, as the claim would have cost anyway. The choice is the policy's either way, made from the
survey taken just before the guessed claim. On a CPU device, where Redis takes its turns on the cores that
compute, each round trip saved is time for the units. Planning a trial is work of the same kind: it needs
the device, so a free device plans waiting trials before it runs units, but only one device at a time
leaves training for it: while another device plans, one with units to run runs them (an idle one plans
too). So a sweep of hundreds of trials arriving at once is planned by one device while the others go on
training. The device that is to plan next takes its trial in its survey's script.

While a unit runs, the loop already knows which trial it will most likely take next (the policy applied to
the survey, with the current trial's remaining time reduced by one unit) and hands that guess to the
runner, which loads that unit's shard in the background, even when it belongs to another trial.

A unit that ran out of device memory comes back as `Replanned` instead: the trial takes its new, smaller
plan and returns to the queue, and a "replan" span marks the time it cost on the device's timeline.

A unit that raises fails its trial (the message goes to the UI) and the loop goes on with the others. A
unit whose trial refuses it because its lease was lost (the worker was slow, and a newer lease holder took
the trial) is dropped: nothing was committed, and the trial is the newer holder's.

Redis down or restarting never ends the loop: it surveys again, waiting longer each time (up to
``REDIS_RETRY_MAX_S``). A unit whose completion could not be sent was committed to its spill store; once
its lease expires the next holder finds it committed but unreported and reports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import redis

from worker.contract import Job
from worker.scheduling import telemetry
from worker.scheduling.fair_share import PRIORITIES
from worker.scheduling.policy import (
    HOLD_UNITS,
    BaseShard,
    Candidate,
    pick,
    ranked,
    remaining_seconds,
    unit_time_estimate,
)
from worker.scheduling.queue import Lease, LeaseLost, PlanJob, ShardQueue, Survey
from worker.scheduling.runner import LaneBusy, Replanned, TrialRunner, UnitDone
from worker.scheduling.telemetry import Span

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
REDIS_RETRY_MAX_S = 5.0  # the longest wait between two surveys while Redis cannot be reached


@dataclass(frozen=True)
class DeviceLoopConfig:
    """`device` is the device's name on its host (``cpu0``, ``cuda1``); `epoch` the loop's generation."""

    device: str
    epoch: str
    idle_wait_s: float = IDLE_WAIT_S


@dataclass(eq=False)
class _Held:
    renew: Callable[[], bool]
    period_s: float
    what: str
    due: float  # time.monotonic() of the next renewal


class LeaseKeeper:
    """One thread per loop that renews the lease being held every third of its length.

    A thread of its own because the unit's computation cannot pause to renew; one for the whole loop, not
    one per unit, because starting a thread costs a fair share of the queue's budget per unit. Taking and
    dropping a lease only sets a field under the lock: the thread is woken only when it would otherwise
    sleep past the new lease's first renewal (it sleeps until a renewal is due, or indefinitely when nothing
    is held). Units follow each other without waking it, where two wake-ups per unit (on a one-core CPU
    device, each one takes the core from the unit) doubled the units' involuntary context switches.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: _Held | None = None
        self._stopped = False
        self._wakes_at = float("inf")  # when the thread's current sleep ends (inf: until notified)
        self._thread = threading.Thread(target=self._run, name="hydra-lease-keeper", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def holding(self, renew: Callable[[], bool], lease_s: float, what: str) -> Iterator[None]:
        """Keep renewing with `renew` while the block runs."""
        held = _Held(renew, lease_s / 3, what, time.monotonic() + lease_s / 3)
        with self._cond:
            self._held = held
            if held.due < self._wakes_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                if self._held is held:
                    self._held = None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                held = self._held
                left = float("inf") if held is None else held.due - time.monotonic()
                if left > 0:
                    self._wakes_at = time.monotonic() + left
                    self._cond.wait(None if held is None else left)
                    continue
                self._cond.release()  # the unit may end meanwhile
                try:
                    renewed = held.renew()
                except redis.RedisError as error:  # Redis restarting: try again at the next renewal
                    log.warning("lease on %s not renewed: %s", held.what, error)
                    renewed = True
                finally:
                    self._cond.acquire()
                held.due = time.monotonic() + held.period_s
                if not renewed:
                    # The unit keeps running (it cannot be interrupted); its completion will be refused.
                    log.warning("lease on %s lost; another device will re-run its unit", held.what)
                    if self._held is held:
                        self._held = None


class DeviceLoop:
    """The loop of one device. `runners` maps a job's ``kind`` to the runner of such trials."""

    def __init__(self, *, queue: ShardQueue, runners: Mapping[str, TrialRunner], config: DeviceLoopConfig):
        self.queue = queue
        self.runners = runners
        self.config = config
        self.device = config.device
        self.pid = os.getpid()
        self.keeper = LeaseKeeper()
        self._survey: Survey | None = None  # made right after the last unit's completion, in its round trip
        self._holding: BaseShard | None = None  # the shared base layers this device's last unit read
        self._next: Lease | None = None  # the next unit of the trial this device holds, leased with that completion

    def run(self) -> None:
        """Run until the queue says this loop is no longer the device's current one (or it must stop)."""
        log.info("device loop of %s started (epoch %s, pid %d)", self.device, self.config.epoch, self.pid)
        wait_s = self.config.idle_wait_s
        try:
            while True:
                try:
                    if not self.turn():
                        break
                    wait_s = self.config.idle_wait_s
                except (redis.ConnectionError, redis.TimeoutError) as error:
                    # What this turn surveyed or was leased may be lost; the next turn surveys afresh.
                    self._survey = self._next = None
                    log.warning("device %s: Redis unavailable (%s); surveying again in %.1f s", self.device,
                                error, wait_s)
                    time.sleep(wait_s)
                    wait_s = min(2 * wait_s, REDIS_RETRY_MAX_S)
        finally:
            self.keeper.stop()
        log.info("device loop of %s ended (epoch %s)", self.device, self.config.epoch)

    def turn(self) -> bool:
        """Plan one trial, run one unit, or wait a little for work. False when the loop must end."""
        self._report_checkpoints()
        survey = self._survey or self.queue.survey(self.device, self.config.epoch, holding=self._holding, plan=True)
        self._survey = None
        if not survey.alive:
            return False
        if survey.reap is not None:
            self._discard(survey.reap)
        if self._next is not None:
            lease, self._next = self._next, None
            self._run_unit(lease, survey)
            return True
        if survey.planned is not None:  # this device was to plan next, and its survey took the trial
            self._plan(survey.planned)
            return True
        if survey.claimed is not None:
            # The survey's round trip claimed what this device guessed the policy would choose; the policy,
            # now applied to that survey, confirms it, or it goes back as it was and the choice is claimed.
            first = pick(survey.candidates, self.device, self._holding, survey.shares)
            if first is not None and first.trial_id == survey.claimed.trial_id:
                self._run_unit(survey.claimed, survey)
                return True
        choices = ranked(survey.candidates, self.device, self._holding, survey.shares)
        if survey.claimed is not None:
            lease = self.queue.unclaim_then_claim(survey.claimed, [c.trial_id for c in choices])
            if lease is not None:
                self._run_unit(lease, survey)
            if choices:
                return True  # (None: other devices took them all; survey again)
        # A device with units to run leaves them to plan only while no other device plans (see claim_plan);
        # the survey says whether one does, which spares this device a round trip per unit meanwhile.
        if survey.planning and not (choices and survey.planning_elsewhere):
            job = self.queue.claim_plan(self.device, idle=not choices)
            if job is not None:
                self._plan(job)
                return True
        if not choices:
            self.queue.wait_for_work(self.config.idle_wait_s)
            return True
        lease = self.queue.claim_first([c.trial_id for c in choices], self.device)
        if lease is not None:  # None: other devices claimed them all first; survey again
            self._run_unit(lease, survey)
        return True

    def _report_checkpoints(self) -> None:
        """Send the durable checkpoints the runners wrote in the background since the last turn to the
        telemetry stream (the web app shows each trial's last one)."""
        written = [record for runner in self.runners.values() for record in runner.checkpoints()]
        if written:
            pipe = self.queue.client.pipeline(transaction=False)
            for record in written:
                telemetry.add(pipe, self.queue.host_id, "checkpoints", record)
            pipe.execute()

    def _runner(self, job: Job) -> TrialRunner:
        kind = job.kind
        if kind not in self.runners:
            raise KeyError(f"no runner for trial kind {kind!r}; this worker runs {sorted(self.runners)}")
        return self.runners[kind]

    def _discard(self, trial_id: str) -> None:
        """Free the state of a trial that ended cancelled or failed (its spill store holds host memory)."""
        for runner in self.runners.values():
            try:
                runner.discard(trial_id=trial_id)
            except OSError:
                log.exception("could not free the state of trial %s", trial_id)

    def _plan(self, job: PlanJob) -> None:
        start = time.time()
        try:
            with self.keeper.holding(lambda: self.queue.renew(job.trial_id, job.token), job.lease_s, job.trial_id):
                planned = self._runner(job.job).plan(trial_id=job.trial_id, job=job.job)
        except Exception as error:  # any failure of planning is the trial's, never the device's
            self._fail(job.trial_id, job.token, "planning", error)
            return
        span = self._trial_span(job.trial_id, "plan", start, time.time())
        try:
            state = self.queue.plan_done(
                job, remaining_units=planned.remaining_units, unit_s=planned.unit_s, plan=planned.plan,
                units_done=planned.units_done, ready=planned.ready, ready_version=planned.ready_version,
                expired=planned.expired, also=lambda pipe: telemetry.add(pipe, self.queue.host_id, "spans", span),
            )
        except LeaseLost as error:
            log.warning("%s", error)
            return
        log.info("trial %s planned on %s: %d units, now %s", job.trial_id, self.device,
                 planned.remaining_units, state)

    def _likely_next(self, survey: Survey, trial_id: str, remaining_units: int, unit_s: float,
                     next_base: BaseShard | None, holding: BaseShard | None, limit: int) -> list[str]:
        """The trials the policy will most likely choose, best first, once the unit of `trial_id` this device
        runs has ended with `remaining_units` of `unit_s` left, its next unit reading `next_base`, the device
        holding `holding`: the policy applied to `survey` with that trial so changed. A guess: other devices
        change the queue meanwhile."""
        mine = next((c for c in survey.candidates if c.trial_id == trial_id), None)
        likely = [c for c in survey.candidates if c.trial_id != trial_id]
        if remaining_units > 0:
            likely.append(Candidate(trial_id, remaining_seconds(remaining_units, unit_s), self.device,
                                    next_base=next_base, team=mine.team if mine else "",
                                    priority=mine.priority if mine else PRIORITIES["normal"]))
        return [c.trial_id for c in ranked(likely, self.device, holding, survey.shares, limit=limit)]

    def _next_guess(self, survey: Survey, lease: Lease) -> str | None:
        """The trial this device will most likely claim after this unit (this one comes back a unit shorter),
        for the runner to start loading. After the unit the device holds the base layers it reads: the
        trial's next_base as last surveyed."""
        holding = next((c.next_base for c in survey.candidates if c.trial_id == lease.trial_id), self._holding)
        guess = self._likely_next(survey, lease.trial_id, lease.remaining_units - 1, lease.unit_s, None, holding,
                                  limit=1)
        return guess[0] if guess else None

    def _run_unit(self, lease: Lease, survey: Survey) -> None:
        """Run the leased unit, chosen from `survey`, then record it (`_record`)."""
        next_trial = self._next_guess(survey, lease)
        start = time.time()
        try:
            with self.keeper.holding(lambda: self.queue.renew(lease.trial_id, lease.token), lease.lease_s,
                                     lease.trial_id):
                runner = self._runner(lease.job)
                done = runner.run_unit(trial_id=lease.trial_id, job=lease.job, units_done=lease.units_done,
                                       next_trial=next_trial, token=int(lease.token), lane=lease.lane,
                                       expired=lease.expired)
                if isinstance(done, UnitDone) and done.remaining_units == 0:
                    runner.export(trial_id=lease.trial_id, job=lease.job, export_dir=lease.export_dir)
        except LeaseLost as error:  # a newer lease holder owns the trial: drop this unit, fail nothing
            log.warning("unit dropped: %s", error)
            return
        except LaneBusy as error:  # the queue's view of the lane was behind its state: give the lease back
            log.info("lease of trial %s given back: %s", lease.trial_id, error)
            with contextlib.suppress(LeaseLost):
                self.queue.unclaim(lease, remaining_units=error.remaining_units, ready=error.ready,
                                   ready_version=error.ready_version)
            return
        except Exception as error:  # a unit that raises fails its trial; the other trials go on
            self._fail(lease.trial_id, lease.token, f"unit {lease.units_done}", error)
            return
        end = time.time()
        if isinstance(done, Replanned):
            self._holding = None
            self._replanned(lease, done, start, end)
        else:
            self._holding = done.base
            self._record(lease, done, start, end, survey)

    def _replanned(self, lease: Lease, replanned: Replanned, start: float, end: float) -> None:
        span = self._trial_span(lease.trial_id, "replan", start, end)
        try:
            state = self.queue.replan(
                lease, remaining_units=replanned.remaining_units, unit_s=replanned.unit_s, plan=replanned.plan,
                message=replanned.message, ready=replanned.ready, ready_version=replanned.ready_version,
                also=lambda pipe: telemetry.add(pipe, self.queue.host_id, "spans", span),
            )
        except LeaseLost as error:
            log.warning("%s", error)
            return
        log.warning("trial %s on %s: %s; now %s", lease.trial_id, self.device, replanned.message, state)

    def _trial_span(self, trial_id: str, phase: str, start: float, end: float) -> Span:
        """A span of work on a whole trial rather than one of its units (planning, re-planning)."""
        return Span(trial=trial_id, device=self.device, unit=-1, step=-1, micro_batch=0, phase=phase, shard=-1,
                    start=start, end=end, bytes_moved=0, peak_bytes=0, pid=self.pid)

    def _record(self, lease: Lease, done: UnitDone, start: float, end: float, survey: Survey) -> None:
        """Complete the unit, write its telemetry and survey for the next turn, in one round trip. Unless the
        device holds the trial (then its next unit is leased with the completion), the survey also claims
        what the policy will most likely choose from it, by `survey` (the one this unit was chosen from) with
        this trial as the unit left it."""
        span = Span(trial=lease.trial_id, device=self.device, unit=lease.units_done, step=done.step,
                    micro_batch=done.micro_batch, phase=done.phase, shard=done.shard, start=start, end=end,
                    bytes_moved=done.bytes_moved, peak_bytes=done.peak_bytes, pid=self.pid, io_s=done.io_s)
        unit_s = unit_time_estimate(lease.unit_s, end - start)
        claim = [] if done.keeps_activations else self._likely_next(
            survey, lease.trial_id, done.remaining_units, unit_s, done.next_base, done.base, limit=3)
        try:
            _, self._survey, self._next = self.queue.complete_then_survey(
                lease, self.config.epoch, remaining_units=done.remaining_units, unit_s=unit_s, message=done.message,
                steps_done=done.step + 1, next_base=done.next_base, holding=done.base, pruned=done.pruned,
                rung=done.rung, ready=done.ready, ready_version=done.ready_version, claim=claim,
                plan=not done.keeps_activations,
                hold_s=HOLD_UNITS * unit_s if done.keeps_activations else 0.0,
                also=lambda pipe: telemetry.add_all(pipe, self.queue.host_id, span=span, steps=done.steps,
                                                    evals=done.evals),
            )
        except LeaseLost as error:  # the unit is another device's now; what the survey saw and took still holds
            log.warning("%s", error)
            self._survey = error.survey if isinstance(error.survey, Survey) else None

    def _fail(self, trial_id: str, token: str, where: str, error: Exception) -> None:
        log.exception("trial %s failed in %s on %s", trial_id, where, self.device)
        message = f"{where} failed on {self.device}: {type(error).__name__}: {error}"
        try:
            self.queue.fail(trial_id, token, message)
        except LeaseLost as lost:
            log.warning("%s", lost)
