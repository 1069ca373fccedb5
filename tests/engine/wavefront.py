"""Run a trial's units as wavefronts on several simulated devices in one process, the way device workers would.

Each device is a session of its own (its own layer stack, caches and background reader) on a thread of its own.
The run goes in rounds: every device takes a lane whose next unit can run (the first not taken this round, in the
order the session reports them: most urgent first), all of them take their lanes before any computes, they compute
one at a time (a unit sets the process's global RNG, which real devices, each a process of its own, do not share),
and they commit in reverse order, so that every commit of a round but the first finds another lane's commit landed
since its writer read the store and merges onto it.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from worker.engine import TrialSession, UnitResult

CPU = torch.device("cpu")
TIMEOUT_S = 120.0


@dataclass
class Round:
    """One round's choreography (see the module docstring), as the fault hook sessions call at their points."""

    devices: int
    taken: threading.Barrier = field(init=False)
    computed: threading.Barrier = field(init=False)
    compute: threading.Lock = field(default_factory=threading.Lock)
    turn: threading.Condition = field(default_factory=threading.Condition)
    next_to_commit: int = 0
    order: list[int] = field(default_factory=list)  # device ranks in the order they commit

    def __post_init__(self) -> None:
        self.taken = threading.Barrier(self.devices, timeout=TIMEOUT_S)
        self.computed = threading.Barrier(self.devices, timeout=TIMEOUT_S)
        self.order = list(reversed(range(self.devices)))


class DeviceHook:
    """`TrialSession.fault` of one simulated device: blocks at its points as its round says."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.round: Round | None = None

    def reach(self, point: str, *, trial_id: str, unit: int) -> None:
        plan = self.round
        if plan is None:
            return
        if point == "before-compute":
            plan.taken.wait()
            plan.compute.acquire(timeout=TIMEOUT_S)
        elif point == "before-commit":
            plan.compute.release()
            plan.computed.wait()
            with plan.turn:
                plan.turn.wait_for(lambda: plan.order[plan.next_to_commit] == self.rank, timeout=TIMEOUT_S)
        elif point == "after-commit":
            with plan.turn:
                plan.next_to_commit += 1
                plan.turn.notify_all()


@dataclass
class WavefrontRun:
    results: list[UnitResult]  # in commit order
    widest: int  # the most units of the trial that ran in one round


def run_wavefront(spill_dir: Path, trial_id: str, devices: int, *, first_token: int = 1) -> WavefrontRun:
    """Run trial `trial_id` to its end on `devices` simulated devices (see the module docstring), with fencing
    tokens from `first_token` on."""
    sessions = [TrialSession.open(spill_dir=spill_dir, trial_id=trial_id, device=CPU) for _ in range(devices)]
    hooks = [DeviceHook(rank) for rank in range(devices)]
    for session, hook in zip(sessions, hooks, strict=True):
        session.fault = hook  # type: ignore[assignment]
    tokens = itertools.count(first_token)
    results: list[UnitResult] = []
    widest = 0
    try:
        while lanes := sessions[0].ready_lanes():
            lanes = lanes[:devices]
            plan = Round(len(lanes))
            done: dict[int, UnitResult] = {}
            errors: list[BaseException] = []

            def run(rank: int, lane: int, token: int, plan: Round = plan, done: dict[int, UnitResult] = done,
                    errors: list[BaseException] = errors) -> None:
                hooks[rank].round = plan
                try:
                    done[rank] = sessions[rank].run_unit(token=token, lane=lane)
                except BaseException as error:
                    errors.append(error)
                    plan.taken.abort()
                    plan.computed.abort()
                finally:
                    hooks[rank].round = None

            threads = [threading.Thread(target=run, args=(rank, lane, next(tokens))) for rank, lane in enumerate(lanes)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TIMEOUT_S)
            if errors:
                raise errors[0]
            results.extend(done[rank] for rank in plan.order)
            widest = max(widest, len(lanes))
    finally:
        for session in sessions:
            session.close()
    return WavefrontRun(results, widest)
