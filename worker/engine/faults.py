"""Fault injection at named points of a unit, for crash, fencing and out-of-memory tests. Off by default.

A `Fault` names one point and what happens there:

    block   report that the point was reached, then wait until released (a test kills or freezes the
            process meanwhile, or lets a newer writer take the trial)
    oom     raise ``torch.OutOfMemoryError``, as a device too small for the unit would
    exit    end the process at once (``os._exit``: no clean-up, no flushing), like a crash

It fires once: the first time any process reaches its point (in unit `unit` when set) it creates
``signal_dir/reached`` (JSON: point, action, trial, unit, pid), and no process fires it again while that
file exists, so the unit's re-run (on another device, or after re-planning) passes through. A blocked
process goes on when ``signal_dir/release`` exists. Workers read it from ``HYDRA_FAULT`` and
``HYDRA_FAULT_DIR`` (`worker.config`); the engine gets it as this object (``TrialSession.fault``).

The points, in the order a unit reaches them (a point a unit does not pass is skipped; the fault then
fires at the next unit that passes it):

    before-compute  the unit has taken the store and not started
    mid-forward     the shard's first layer ran forward (F, FB, E, and B when it recomputes)
    mid-backward    the backward reached the output of the shard's first layer (FB, B)
    mid-step        a shard's optimizer update stepped its first chunk, none of it is written yet
    before-write    the unit is about to create its first file
    mid-write       the unit staged a buffer and is about to create another
    before-commit   every output is staged, none is committed
    after-commit    the unit is committed; its caller has not seen the result
    mid-export      the export wrote its first shard's file

This module stays torch-free (the web app's configuration imports it); ``oom`` imports torch when it fires.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POINTS = ("before-compute", "mid-forward", "mid-backward", "mid-step", "before-write", "mid-write",
          "before-commit", "after-commit", "mid-export")
ACTIONS = ("block", "oom", "exit")
EXIT_STATUS = 86  # what an ``exit`` fault ends its process with
REACHED = "reached"
RELEASE = "release"
POLL_S = 0.01


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Do `action` at `point` (of timetable unit `unit`, or of the first unit that reaches it), once."""

    point: str
    action: str = "block"
    unit: int | None = None
    signal_dir: Path

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ValueError(f"fault point {self.point!r} is not one of {', '.join(POINTS)}")
        if self.action not in ACTIONS:
            raise ValueError(f"fault action {self.action!r} is not one of {', '.join(ACTIONS)}")

    @classmethod
    def parse(cls, text: str, *, signal_dir: Path) -> Fault:
        """``<point>[:<action>][@<unit>]``, e.g. ``mid-write``, ``mid-backward:oom@13``; ValueError if bad."""
        where, _, unit = text.strip().partition("@")
        point, _, action = where.partition(":")
        if unit and not unit.isdigit():
            raise ValueError(f"fault {text!r}: the unit after '@' must be a timetable index, not {unit!r}")
        return cls(point=point, action=action or "block", unit=int(unit) if unit else None, signal_dir=signal_dir)

    def reach(self, point: str, *, trial_id: str, unit: int) -> None:
        """Called by the engine at each named point of unit `unit` of trial `trial_id`; fires if it is ours."""
        if point != self.point or (self.unit is not None and unit != self.unit):
            return
        reached = self.signal_dir / REACHED
        if reached.exists():
            return  # fired already
        self.signal_dir.mkdir(parents=True, exist_ok=True)
        report = {"point": point, "action": self.action, "trial": trial_id, "unit": unit, "pid": os.getpid()}
        draft = self.signal_dir / f"{REACHED}.{os.getpid()}.{threading.get_ident()}"
        draft.write_text(json.dumps(report))
        try:
            os.link(draft, reached)  # atomic and exclusive: of the processes that reach the point, one fires
        except FileExistsError:
            return
        finally:
            draft.unlink()
        if self.action == "exit":
            os._exit(EXIT_STATUS)
        if self.action == "oom":
            import torch

            raise torch.OutOfMemoryError(f"fault injection: out of memory at {point} of unit {unit}")
        while not (self.signal_dir / RELEASE).exists():
            time.sleep(POLL_S)
