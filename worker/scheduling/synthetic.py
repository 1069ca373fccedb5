"""Synthetic trials: units that sleep a fixed time and train nothing.

They measure the scheduler itself (`benchmarks/queue_overhead.py` uses ``unit_ms=0``) and exercise it
without the engine. Spec::

    {"kind": "synthetic", "units": 6, "unit_ms": 50, "fail_at_unit": null}

``fail_at_unit`` makes that unit raise, which fails the trial like a crashing engine unit would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from worker.scheduling.runner import Planned, UnitDone, WorkloadError


class SyntheticUnitError(WorkloadError):
    pass


def synthetic_spec(*, units: int, unit_ms: float = 0.0, fail_at_unit: int | None = None) -> dict[str, Any]:
    """The spec of a synthetic trial; raises ValueError on impossible values."""
    if units < 1:
        raise ValueError(f"a synthetic trial needs at least one unit; got units={units}.")
    if unit_ms < 0:
        raise ValueError(f"unit_ms={unit_ms} must not be negative.")
    return {"kind": "synthetic", "units": units, "unit_ms": unit_ms, "fail_at_unit": fail_at_unit}


class SyntheticRunner:
    """Runs synthetic trials. Their only state is the queue's count of units done."""

    def plan(self, *, trial_id: str, spec: Mapping[str, Any]) -> Planned:
        return Planned(remaining_units=spec["units"], unit_s=max(spec["unit_ms"] / 1000, 1e-6),
                       plan={"kind": "synthetic", "units": spec["units"]})

    def run_unit(self, *, trial_id: str, spec: Mapping[str, Any], units_done: int, next_trial: str | None,
                 token: int) -> UnitDone:
        if spec["unit_ms"]:
            time.sleep(spec["unit_ms"] / 1000)
        if units_done == spec["fail_at_unit"]:
            raise SyntheticUnitError(f"synthetic unit {units_done} of trial {trial_id!r} failed on purpose")
        return UnitDone(remaining_units=spec["units"] - units_done - 1, step=units_done, micro_batch=0,
                        phase="synthetic", shard=0, bytes_moved=0, peak_bytes=0)

    def export(self, *, trial_id: str, spec: Mapping[str, Any], export_dir: str) -> None:
        """A synthetic trial has no result to write."""

    def discard(self, *, trial_id: str) -> None:
        """A synthetic trial keeps no state outside the queue."""
