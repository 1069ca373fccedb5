"""`ShardQueue`: the shard task queue of one host, in Redis, changed only by its Lua scripts.

The scripts are ``lua/*.lua`` (`worker.scheduling.queue.scripts` loads and runs them), the keys they keep are
listed in `worker.scheduling.keys`, and the speculative claim a survey may make is
`worker.scheduling.queue.speculative`'s. This class validates arguments, names them for the scripts and turns
their replies into the contract's records and errors.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from worker.contract import InvalidTransition, Job, LeaseLost, TrialExists, TrialNotFound, TrialRecord
from worker.scheduling.fair_share import PRIORITIES
from worker.scheduling.keys import HOSTS_KEY, TEAM, host_prefix
from worker.scheduling.placement import HostLoad
from worker.scheduling.policy import BaseShard, Shares
from worker.scheduling.queue import speculative
from worker.scheduling.queue.records import (
    TRIAL_ID_PATTERN,
    Lease,
    PlanJob,
    Survey,
    _record,
    claim_ids,
    lease_from,
    plan_job_from,
    shares_from,
    survey_from,
)
from worker.scheduling.queue.script_args import _complete_args, _lanes, _survey_args
from worker.scheduling.queue.scripts import Also, Clock, Scripts

TEAM_PATTERN = re.compile(f"^{TEAM}$")


class ShardQueue:
    """The shard task queue of one host in Redis. All state changes are single Lua scripts (atomic).

    `client` must decode responses (``decode_responses=True``). `clock` gives the time the queue's scripts
    take as now, in seconds since the epoch; None (what workers and the web app use): Redis's own clock, so
    that hosts with skewed clocks agree on when a lease expires. A test passes a clock it moves forward to
    expire a lease or lapse a hold without sleeping.
    """

    def __init__(self, client: redis.Redis, host_id: str, *, clock: Clock | None = None) -> None:
        self.client = client
        self.host_id = host_id
        self.prefix = host_prefix(host_id)
        self._scripts = Scripts(client, self.prefix, clock)

    def key(self, name: str) -> str:
        """The full Redis key of `name` (``trials``, ``runnable``, ``trial:<id>``...; see `worker.scheduling.keys`)."""
        return self.prefix + name

    def _run_after(self, also: Also | None, name: str, **args: object) -> Any:
        """Run script `name` after the commands `also` queues (telemetry), in one round trip."""
        if also is None:
            return self._scripts.run(name, **args)
        return self._scripts.run_all([(name, args)], also)[0]

    # Configuration --------------------------------------------------------------------------------------

    def configure(self, *, lease_s: float | None = None, usage_half_life_s: float | None = None,
                  capacity_bytes: int | None = None) -> None:
        """Set the lease length of this host's units, the half-life of teams' usage and the bytes of the host
        tier that trials' spill stores may take (0: no limit; see admission in `claim_plan`). Each is read at
        every claim and survey, so no restart is needed."""
        for name, value in (("lease_s", lease_s), ("usage_half_life_s", usage_half_life_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value} must be positive.")
        if capacity_bytes is not None:
            if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
                raise ValueError(f"capacity_bytes={capacity_bytes!r} must be a whole number of bytes, 0 or more.")
            self.client.hset(self.key("config"), "capacity_bytes", capacity_bytes)
            self.client.delete(self.key("planning_blocked"))  # the waiting trials may fit now
        if lease_s is not None:
            self.client.hset(self.key("config"), "lease_ms", int(lease_s * 1000))
        if usage_half_life_s is not None:
            self.client.hset(self.key("config"), "half_life_ms", int(usage_half_life_s * 1000))

    def set_quotas(self, quotas: Mapping[str, int], byte_quotas: Mapping[str, int] | None = None) -> None:
        """Set the most trials (`quotas`) and spill-store bytes (`byte_quotas`) each team may have admitted on
        this host at once (planned and not ended; a paused trial keeps its place, as it keeps its spill store).
        A team not named has no such quota; a trial over its team's quota waits to be planned, it never fails
        for it."""
        byte_quotas = byte_quotas or {}
        for name, limits in (("quotas", quotas), ("byte_quotas", byte_quotas)):
            if bad := {team: q for team, q in limits.items() if not isinstance(q, int) or q < 1}:
                raise ValueError(f"{name} must be whole numbers, 1 or more; got {bad}.")
        pipe = self.client.pipeline()
        for name, limits in (("quotas", quotas), ("byte_quotas", byte_quotas)):
            pipe.delete(self.key(name))
            if limits:
                pipe.hset(self.key(name), mapping=dict(limits))
        pipe.delete(self.key("planning_blocked"))  # the waiting trials may be admitted now
        pipe.execute()

    def set_capacity_override(self, capacity_bytes: int | None) -> None:
        """Set (or, with None, drop) the host tier's capacity an administrator chose for this host; it takes
        precedence over what the host's workers found when they started (`configure(capacity_bytes=)`)."""
        if capacity_bytes is not None and (not isinstance(capacity_bytes, int) or capacity_bytes < 0):
            raise ValueError(f"capacity_bytes={capacity_bytes!r} must be a whole number of bytes, 0 or more.")
        pipe = self.client.pipeline()
        if capacity_bytes is None:
            pipe.hdel(self.key("config"), "capacity_override_bytes")
        else:
            pipe.hset(self.key("config"), "capacity_override_bytes", capacity_bytes)
        pipe.delete(self.key("planning_blocked"))  # the waiting trials may fit now
        pipe.execute()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Set the teams' fair-share weights (a team not named weighs 1); they count from the next survey."""
        if bad := {team: w for team, w in weights.items() if not (0 < w < float("inf"))}:
            raise ValueError(f"weights must be positive numbers; got {bad}.")
        pipe = self.client.pipeline()
        pipe.delete(self.key("weights"))
        if weights:
            pipe.hset(self.key("weights"), mapping={team: repr(float(w)) for team, w in weights.items()})
        pipe.execute()

    # Submitting and controlling trials -----------------------------------------------------------------

    def submit(self, *, trial_id: str, job: Job, export_dir: str, team: str = "", priority: str = "normal",
               host_bytes: int = 0, lane_bytes: int = 0, paused: bool = False) -> None:
        """Add a trial in state planning; a device worker will plan it once it is admitted. `team` shares
        the devices with the other teams by fair share; `priority` (low, normal, high) orders the team's own
        trials; `host_bytes` is what its spill store will take on the host tier (0: unknown, counted as
        nothing), which admission checks against the host's capacity, and `lane_bytes` what it takes more for
        each device beyond the first its micro-batches run on at once (a wavefront: admission admits it as wide
        as there is room for, up to `Job.width_cap`). `paused`: once planned, the trial waits paused until
        resumed (see `resume_all`, for a sweep released at once). Raises TrialExists, ValueError."""
        for name, value in (("host_bytes", host_bytes), ("lane_bytes", lane_bytes)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be a whole number of bytes, 0 or more.")
        if not TRIAL_ID_PATTERN.match(trial_id):
            raise ValueError(f"trial id {trial_id!r} must be 1-64 letters, digits, '.', '_' or '-'.")
        if not TEAM_PATTERN.match(team):
            raise ValueError(f"team {team!r} must be at most 64 letters, digits, '.', '_' or '-'.")
        if priority not in PRIORITIES:
            raise ValueError(f"priority {priority!r} must be one of {', '.join(PRIORITIES)}.")
        outcome = self._scripts.run("submit", id=trial_id, job=json.dumps(job.to_dict()), export_dir=export_dir,
                                    team=team, priority=PRIORITIES[priority], host_bytes=host_bytes,
                                    paused="1" if paused else "0", width_cap=job.width_cap, lane_bytes=lane_bytes)
        if outcome == "exists":
            raise TrialExists(f"trial {trial_id!r} already exists on host {self.host_id!r}.")

    def pause(self, trial_id: str) -> str:
        """Pause now if runnable, else when its unit in flight ends. Returns the state now."""
        return self._control("pause", trial_id)

    def resume(self, trial_id: str) -> str:
        """Make a paused trial runnable again (or drop a pending pause). Returns the state now."""
        return self._control("resume", trial_id)

    def cancel(self, trial_id: str) -> str:
        """Cancel now if not in flight, else when its unit ends. Returns the state now."""
        return self._control("cancel", trial_id)

    def resume_all(self, trial_ids: Sequence[str]) -> list[str]:
        """`resume` each of `trial_ids`, in one round trip: a sweep held back as a whole goes to the devices at
        once. Their states; raises as `resume` does for the first that could not be resumed (the others are
        resumed all the same)."""
        outcomes: list[str] = self._scripts.run_all([("control", {"action": "resume", "id": trial_id})
                                                     for trial_id in trial_ids])
        return [self._checked("resume", trial_id, outcome) for trial_id, outcome in zip(trial_ids, outcomes,
                                                                                       strict=True)]

    def _control(self, action: str, trial_id: str) -> str:
        return self._checked(action, trial_id, self._scripts.run("control", action=action, id=trial_id))

    def _checked(self, action: str, trial_id: str, outcome: str) -> str:
        """A control script's outcome, or the error it stands for."""
        if outcome == "missing":
            raise TrialNotFound(f"trial {trial_id!r} does not exist on host {self.host_id!r}.")
        if outcome.startswith("invalid:"):
            state = outcome.removeprefix("invalid:")
            raise InvalidTransition(f"cannot {action} trial {trial_id!r}: it is {state}.")
        return outcome

    # What device workers do ---------------------------------------------------------------------------

    def device_start(self, device: str, epoch: str) -> None:
        """Make `epoch` the device's current loop; loops of older epochs end at their next survey."""
        self.client.hset(self.key(f"device:{device}"), mapping={"epoch": epoch, "stop": "0"})

    def device_stop(self, device: str) -> None:
        """Ask the device's loop to end at its next unit boundary (the worker is shutting down)."""
        self.client.hset(self.key(f"device:{device}"), "stop", "1")

    def register_host(self) -> None:
        """Say that this host has device workers (they call it when they start), so the web app places trials
        on it (`worker.scheduling.placement`)."""
        self.client.zadd(HOSTS_KEY, {self.host_id: int(self._scripts.now_s() * 1000)})

    def live_devices(self, *, live_within_s: float = 60.0, now: float | None = None) -> list[str]:
        """The devices whose loops surveyed the queue within `live_within_s` and were not asked to stop."""
        now = self._scripts.now_s() if now is None else now
        return [name for name, fields in self.devices().items()
                if fields.get("stop") != "1" and now - float(fields.get("seen") or 0) <= live_within_s]

    def load(self, *, live_within_s: float = 60.0) -> HostLoad:
        """What this host holds, for placement: devices seen within `live_within_s`, the host tier's capacity
        and what admitted trials take of it, and its trials with work."""
        now = self._scripts.now_s()
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.key("config"), ["capacity_override_bytes", "capacity_bytes"])
        pipe.get(self.key("admitted_bytes"))
        pipe.hvals(self.key("team_work"))
        pipe.llen(self.key("planning"))
        (override, found), admitted, working, planning = pipe.execute()
        capacity = override if override is not None else found
        live = self.live_devices(live_within_s=live_within_s, now=now)
        return HostLoad(host_id=self.host_id, live_devices=len(live), capacity_bytes=int(capacity or 0),
                        admitted_bytes=int(admitted or 0), trials=sum(int(n) for n in working) + int(planning))

    def shares(self) -> Shares:
        """The fair-share standing of the teams with work now: decayed usage, weight, last service."""
        raw = self._scripts.run("shares")
        return shares_from(raw[1:], int(raw[0]))

    def devices(self) -> dict[str, dict[str, str]]:
        """Every device that ever ran a loop on this host: name -> epoch, stop, seen."""
        prefix = self.key("device:")
        return {
            key.removeprefix(prefix): self.client.hgetall(key)
            for key in sorted(self.client.scan_iter(match=prefix + "*", count=1000))
        }

    def survey(self, device: str, epoch: str, *, holding: BaseShard | None = None, plan: bool = False) -> Survey:
        """Requeue expired leases, then list trials to plan and the candidates the policy picks from:
        the trials `device` holds, each team's longest, and those it has affinity with (its last device,
        or base layers overlapping `holding`, the shared base layers the device holds now).

        A device loop calls it before each claim; the returned `alive` tells it whether to go on. With
        `plan`, a device that is to plan next (trials wait to be planned and no other device plans them)
        takes one in the same script, as `claim_plan` would (`Survey.planned`).
        """
        return survey_from(self._scripts.run("survey", **_survey_args(device, epoch, holding, plan=plan)), device)

    def claim_plan(self, device: str, *, idle: bool = True) -> PlanJob | None:
        """Take a trial waiting to be planned that can be admitted, with a lease; None when there is none,
        or when the device is not `idle` (it has units it could run) and another device is planning: then it
        trains, so that many trials waiting to be planned take one device at a time from training.

        Admission: the trial's team is under its quota (`set_quotas`) and the host tier has room for its
        `host_bytes` (`configure(capacity_bytes=)`). Of the admissible trials, the team whose turn it is by
        fair share goes first, its oldest trial first. The others wait, their record's message saying why.
        """
        return plan_job_from(self._scripts.run("claim_plan", device=device, idle="1" if idle else "0"))

    def plan_done(
        self, job: PlanJob, *, remaining_units: int, unit_s: float, plan: Mapping[str, Any], units_done: int = 0,
        ready: Sequence[int] = (0,), ready_version: int = 0, expired: tuple[int, int] | None = None,
        also: Also | None = None,
    ) -> str:
        """Record a trial's plan and first estimate; it becomes runnable (or paused/cancelled if asked).

        `units_done` > 0 says the trial's state already holds that many units (it resumes from its store).
        `ready`: the lanes whose next unit can run, as of its state's commit `ready_version` (see `complete`).
        `expired`: (lane, token) of a unit its state holds that the queue may never have heard of (the lane's
        next lease reports it first). `also` queues commands to send in the same round trip (telemetry). Raises
        LeaseLost.
        """
        outcome: str = self._run_after(
            also, "plan_done", id=job.trial_id, token=job.token, remaining_units=remaining_units,
            unit_s=repr(unit_s), plan=json.dumps(dict(plan)), units_done=int(units_done), ready=_lanes(ready),
            ready_v=int(ready_version), expired="" if expired is None else f"{expired[0]}={expired[1]}",
        )
        return self._check_lease(outcome, job.trial_id)

    def claim(self, trial_id: str, device: str) -> Lease | None:
        """Claim the next unit of `trial_id` for `device`; None if another device took it first."""
        return self.claim_first([trial_id], device)

    def claim_first(self, trial_ids: Sequence[str], device: str) -> Lease | None:
        """Claim the next unit of the first of `trial_ids` (the policy's choices, best first) that is still
        runnable, in one round trip; None if other devices took them all. Devices that surveyed at the same
        moment see the same best trial: the one that comes second takes the next best at once, rather than
        surveying again."""
        if not trial_ids:
            raise ValueError("claim needs trial ids; got none")
        return lease_from(self._scripts.run("claim", ids=claim_ids(trial_ids), device=device), device)

    def unclaim_then_claim(self, claimed: Lease, trial_ids: Sequence[str]) -> Lease | None:
        """Give back a speculative claim the policy did not confirm, then `claim_first` of `trial_ids` (none:
        only give it back), in one round trip (`worker.scheduling.queue.speculative`)."""
        return speculative.unclaim_then_claim(self._scripts, claimed, trial_ids)

    def unclaim(self, lease: Lease, *, remaining_units: int, ready: Sequence[int], ready_version: int) -> str:
        """Give back a lease whose unit did not run (its lane had no unit that could run after all): as
        `unclaim_then_claim` gives back a speculative claim, with the engine's view of the trial as `complete`
        takes it (its `ready` lanes and `remaining_units` as of commit `ready_version`), so that the lane is not
        leased again until it can run. Raises LeaseLost."""
        return self._check_lease(self._scripts.run(
            "unclaim", id=lease.trial_id, token=lease.token, expired=lease.expired,
            remaining_units=int(remaining_units), ready=_lanes(ready), ready_v=int(ready_version)), lease.trial_id)

    def renew(self, trial_id: str, token: str) -> bool:
        """Extend a lease by the host's lease length; False when it was already lost."""
        return bool(self._scripts.run("renew", id=trial_id, token=token))

    def complete(
        self, lease: Lease, *, remaining_units: int, unit_s: float, message: str = "",
        steps_done: int | None = None, hold_s: float = 0.0, next_base: BaseShard | None = None,
        pruned: bool = False, rung: int | None = None, ready: Sequence[int] = (0,), ready_version: int = 0,
        also: Also | None = None,
    ) -> str:
        """End a unit: the trial finishes (0 units left), or becomes runnable, paused or cancelled; or, while
        units of its other lanes are in flight, stays running.

        `ready` and `remaining_units` are the trial's state as the unit's commit left it, version
        `ready_version`: the lanes whose next unit can run now, and the units left. Units of several lanes may
        complete in another order than they committed; the newest commit's view is kept.

        `unit_s` is the trial's new unit-time estimate; `message` and `steps_done` (the training steps the
        trial has taken, so a reader of the events need not wait for its metrics) go with the finished
        event. `hold_s` > 0 says this device keeps activations of the trial for that long (surveys report
        it as `held_by`). `next_base`: the shared base layers the trial's next unit reads (surveys report
        it, for the policy's base affinity). `pruned`: with 0 units left, the experiment's pruner stopped
        the trial (it ends 'pruned', not 'finished'), and `rung` is the pruner's rung it reached (both go
        with the ended event). `also` queues commands to send in the same round trip (telemetry). Raises
        LeaseLost when the lease expired meanwhile (the unit is being re-run elsewhere).
        """
        args = _complete_args(lease, remaining_units, unit_s, message, steps_done, hold_s, epoch="",
                              next_base=next_base, pruned=pruned, rung=rung, ready=ready, ready_version=ready_version)
        outcome: str = self._run_after(also, "complete", **args)
        return self._check_lease(outcome, lease.trial_id)

    def complete_then_survey(
        self, lease: Lease, epoch: str, *, remaining_units: int, unit_s: float, message: str = "",
        steps_done: int | None = None, hold_s: float = 0.0, next_base: BaseShard | None = None,
        holding: BaseShard | None = None, pruned: bool = False, rung: int | None = None,
        ready: Sequence[int] = (0,), ready_version: int = 0, claim: Sequence[str] = (), plan: bool = False,
        also: Also | None = None,
    ) -> tuple[str, Survey, Lease | None]:
        """`complete`, then `survey` for the same device, in one round trip: what a device loop does between
        two units. Returns the trial's state, the survey, and the lease on the trial's next unit if this
        device holds the trial (`hold_s` > 0) and goes on with it: then the trial stays running (no claim
        is needed; the policy picks a held trial first anyway), unless a pause or cancel is pending, a trial
        waits to be planned and no other device is planning, or the device's loop `epoch` is no longer
        current. `holding`: the shared base layers the unit read, which the device holds after it (for the
        survey).

        `claim`: the device's guess of what its policy will choose from the survey, best first (see
        `policy.ranked`). The survey's script then also claims the first of them still runnable, unless the
        loop must end or the device is to plan next, and the survey carries that lease (`Survey.claimed`):
        when the policy does choose it, the unit needs no round trip of its own to claim; otherwise the device
        gives it back with `unclaim_then_claim`, in the round trip the claim would have taken anyway. `plan`:
        see `survey` (a device to plan next claims no unit).

        Raises LeaseLost when the unit's lease was lost; the survey, made all the same, goes with it
        (``LeaseLost.survey``), with what it claimed."""
        outcome, raw = self._scripts.run_all(also=also, calls=[
            ("complete", _complete_args(lease, remaining_units, unit_s, message, steps_done, hold_s, epoch=epoch,
                                        next_base=next_base, pruned=pruned, rung=rung, ready=ready,
                                        ready_version=ready_version)),
            ("survey", _survey_args(lease.device, epoch, holding, claim, plan)),
        ])
        survey = survey_from(raw, lease.device)
        if isinstance(outcome, list):
            token, lease_ms, lane, expired = outcome
            after = dataclasses.replace(lease, token=token, lease_s=int(lease_ms) / 1000,
                                        units_done=lease.units_done + 1, remaining_units=remaining_units,
                                        unit_s=unit_s, lane=int(lane), expired=expired or "")
            return "running", survey, after
        try:
            return self._check_lease(outcome, lease.trial_id), survey, None
        except LeaseLost as lost:
            lost.survey = survey
            raise

    def replan(
        self, lease: Lease, *, remaining_units: int, unit_s: float, plan: Mapping[str, Any], message: str,
        ready: Sequence[int] = (0,), ready_version: int = 0, also: Also | None = None,
    ) -> str:
        """End a unit that did not complete because its trial was re-planned (out of device memory): the
        trial takes `plan`, its new unit count and `ready` lanes and becomes runnable again (or paused/cancelled
        if asked), with `message` on its event; units of its other lanes in flight lose their leases. Raises
        LeaseLost."""
        outcome: str = self._run_after(
            also, "replan", id=lease.trial_id, token=lease.token, remaining_units=remaining_units,
            unit_s=repr(unit_s), plan=json.dumps(dict(plan)), device=lease.device, message=message,
            ready=_lanes(ready), ready_v=int(ready_version),
        )
        return self._check_lease(outcome, lease.trial_id)

    def fail(self, trial_id: str, token: str, message: str) -> str:
        """Fail a trial whose unit (or planning) raised, keeping `message` for the UI."""
        return self._check_lease(self._scripts.run("fail", id=trial_id, token=token, message=message), trial_id)

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until something may have become claimable, or `timeout_s` passes."""
        self.client.blpop([self.key("wake")], timeout=timeout_s)

    def _check_lease(self, outcome: str, trial_id: str) -> str:
        if outcome == "lost":
            raise LeaseLost(f"the lease on trial {trial_id!r} expired; another device re-runs its unit.")
        return outcome

    # Reading -----------------------------------------------------------------------------------------

    def trial(self, trial_id: str) -> TrialRecord:
        """The trial's state as plain data. Raises TrialNotFound."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.key(f"trial:{trial_id}"))
        pipe.hvals(self.key(f"trial:{trial_id}:leases"))
        pipe.hexists(self.key("admitted"), trial_id)
        fields, leases, admitted = pipe.execute()
        if not fields:
            raise TrialNotFound(f"trial {trial_id!r} does not exist on host {self.host_id!r}.")
        return _record(trial_id, fields, bool(admitted), leases)

    def trials(self) -> list[TrialRecord]:
        """Every trial of this host, oldest first."""
        ids = self.client.zrange(self.key("trials"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        pipe.hkeys(self.key("admitted"))
        for trial_id in ids:
            pipe.hgetall(self.key(f"trial:{trial_id}"))
            pipe.hvals(self.key(f"trial:{trial_id}:leases"))
        admitted, *rows = pipe.execute()
        return [_record(trial_id, fields, trial_id in set(admitted), leases)
                for trial_id, fields, leases in zip(ids, rows[::2], rows[1::2], strict=True) if fields]

    def states(self) -> dict[str, str]:
        """Every trial of this host -> its state, oldest first; `trials` without the jobs and plans."""
        ids = self.client.zrange(self.key("trials"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for trial_id in ids:
            pipe.hget(self.key(f"trial:{trial_id}"), "state")
        return {trial_id: state for trial_id, state in zip(ids, pipe.execute(), strict=True) if state is not None}
