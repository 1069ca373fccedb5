"""What the queue hands a device loop (a unit's lease, a trial to plan, a survey) and the readers of the
scripts' replies they are made from, each reply read in one place; and a trial's `TrialRecord`, read from its
hash and leases."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.contract import Job, TrialRecord, job_from_dict
from worker.scheduling.keys import TRIAL_ID
from worker.scheduling.policy import BaseShard, Candidate, Shares, remaining_seconds

TRIAL_ID_PATTERN = re.compile(f"^{TRIAL_ID}$")


def _stored_job(claimed: PlanJob | Lease) -> Job:
    """The typed job of a claimed trial, parsed on first use; JobError if what was stored cannot be read (the
    device loop then fails the trial, not itself)."""
    return job_from_dict(claimed.job_data)


@dataclass(frozen=True)
class PlanJob:
    """A claimed planning job: plan `trial_id`'s `job`, then call `plan_done` with `token`."""

    trial_id: str
    token: str
    lease_s: float
    job_data: dict[str, Any]

    job = functools.cached_property(_stored_job)


@dataclass(frozen=True)
class Lease:
    """A claimed unit of `trial_id`: the next unit of its `lane` (the micro-batch of its wavefront, see
    `worker.engine.schedule.Segment`); `units_done` units of it ran before. `expired`: the token of the lane's
    lease that expired last, whose unit may have committed without the queue hearing of it ('' for none)."""

    trial_id: str
    token: str
    device: str
    lease_s: float
    units_done: int
    remaining_units: int
    unit_s: float
    job_data: dict[str, Any]
    export_dir: str
    lane: int = 0
    expired: str = ""

    job = functools.cached_property(_stored_job)


@dataclass(frozen=True)
class Survey:
    """What a free device sees: trials waiting to be planned, runnable candidates, their units done.

    `alive` is False when the device's loop must end (its worker stopped or started a newer loop). `reap`
    names a trial that ended cancelled or failed: this device (and no other) frees its state on the host.
    Candidates are each team's runnable trials of its highest priority with any, longest first.
    """

    alive: bool
    planning: int
    candidates: list[Candidate]
    units_done: dict[str, int]
    reap: str | None = None
    shares: Shares = dataclasses.field(default_factory=Shares)  # of the teams with work
    planning_elsewhere: bool = False  # another device is planning a trial now
    # The lease a speculative claim made with this survey took (`worker.scheduling.queue.speculative`), for
    # the device's policy to confirm, or to give back.
    claimed: Lease | None = None
    planned: PlanJob | None = None  # the trial a survey with `plan` took to plan (see `ShardQueue.survey`)


def claim_ids(trial_ids: Sequence[str]) -> str:
    """Trial ids as a claim script takes them, separated by spaces; ValueError for anything not a trial id."""
    if any(not TRIAL_ID_PATTERN.match(t) for t in trial_ids):
        raise ValueError(f"claim needs trial ids; got {list(trial_ids)!r}")
    return " ".join(trial_ids)


def lease_from(raw: list[Any] | None, device: str) -> Lease | None:
    """The lease a claim returns (``id, token, lease_ms, units_done, job, export_dir, remaining_units,
    unit_s, lane, expired``), or None for none."""
    if raw is None:
        return None
    trial_id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s, lane, expired = raw
    return Lease(trial_id=trial_id, token=token, device=device, lease_s=int(lease_ms) / 1000,
                 units_done=int(units_done), remaining_units=int(remaining_units), unit_s=float(unit_s),
                 job_data=json.loads(job), export_dir=export_dir, lane=int(lane), expired=expired or "")


def plan_job_from(raw: list[Any] | None) -> PlanJob | None:
    """The job a claim of a trial to plan returns (``id, token, lease_ms, job``), or None for none."""
    if raw is None:
        return None
    trial_id, token, lease_ms, job = raw
    return PlanJob(trial_id, token, int(lease_ms) / 1000, json.loads(job))


def survey_from(reply: list[Any], device: str) -> Survey:
    """The survey script's reply (``lua/survey.lua``) as a survey: ``[0]`` when the device's loop must end,
    else ``[1, planning, elsewhere, reap, teams]``, four entries per team with work (``team, usage, weight,
    served``) and nine per candidate: ``id, remaining_s, last_device, units_done, held_by, next_base, team,
    priority, wide`` ('' for no trial to reap, no last device, no holder, no base layers, never served); then the
    lease its speculative claim took for `device`, and the trial it took to plan, or nil for each.
    """
    raw, claimed, planned = reply
    if not raw[0]:
        return Survey(alive=False, planning=0, candidates=[], units_done={})
    _, planning, elsewhere, reap, teams, *flat = raw
    shares = shares_from(flat, int(teams))
    candidates, units_done = [], {}
    for i in range(4 * int(teams), len(flat), 9):
        trial_id, score, last_device, done, held_by, next_base, team, priority, wide = flat[i : i + 9]
        candidates.append(Candidate(trial_id, float(score), last_device or None, held_by or None,
                                    BaseShard.parse(next_base), team, int(priority), widening=bool(int(wide))))
        units_done[trial_id] = int(done)
    return Survey(alive=True, planning=int(planning), candidates=candidates, units_done=units_done,
                  reap=reap or None, shares=shares, planning_elsewhere=bool(int(elsewhere)),
                  claimed=lease_from(claimed, device), planned=plan_job_from(planned))


def shares_from(flat: list[Any], teams: int) -> Shares:
    """Fair-share standing from four entries per team: team, usage, weight, served ('' if never)."""
    shares = Shares()
    for i in range(0, 4 * teams, 4):
        team, usage, weight, served = flat[i : i + 4]
        shares.usage[team], shares.weights[team] = float(usage), float(weight)
        if served:
            shares.served[team] = float(served)
    return shares


def _record(trial_id: str, fields: Mapping[str, str], admitted: bool, leases: Sequence[str] = ()) -> TrialRecord:
    remaining_units = int(fields["remaining_units"]) if "remaining_units" in fields else None
    unit_s = float(fields["unit_s"]) if "unit_s" in fields else None
    return TrialRecord(
        trial_id=trial_id,
        state=fields.get("state", ""),
        message=fields.get("message", ""),
        control=fields.get("control", ""),
        device=fields.get("device", ""),
        last_device=fields.get("last_device", ""),
        remaining_units=remaining_units,
        unit_s=unit_s,
        remaining_s=(
            remaining_seconds(remaining_units, unit_s)
            if remaining_units is not None and unit_s is not None
            else None
        ),
        units_done=int(fields.get("units_done", 0)),
        requeues=int(fields.get("requeues", 0)),
        replans=int(fields.get("replans", 0)),
        submitted=float(fields.get("submitted", 0)),
        updated=float(fields.get("updated", 0)),
        export_dir=fields.get("export_dir", ""),
        job=json.loads(fields.get("job", "{}")),
        plan=json.loads(fields["plan"]) if "plan" in fields else None,
        team=fields.get("team", ""),
        priority=int(fields.get("priority", 1)),
        host_bytes=int(fields.get("host_bytes", 0)),
        admitted=admitted,
        devices=sorted({held.split(" ", 1)[1] for held in leases if not held.startswith("plan ")}),
        width=int(fields.get("width", 1)),
        width_cap=int(fields.get("width_cap", 1)),
    )
