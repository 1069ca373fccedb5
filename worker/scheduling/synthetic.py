"""Synthetic trials: units that sleep a fixed time and train nothing.

They measure the scheduler itself (`benchmarks/queue_overhead.py` uses ``unit_ms=0``) and exercise it
without the engine; their job is `worker.contract.SyntheticJob`.
"""

from __future__ import annotations

import time

from worker.contract import SyntheticJob
from worker.scheduling.runner import Planned, UnitDone, WorkloadError
from worker.scheduling.telemetry import CheckpointMetrics


class SyntheticUnitError(WorkloadError):
    pass


class SyntheticRunner:
    """Runs synthetic trials. Their only state is the queue's count of units done."""

    def plan(self, *, trial_id: str, job: SyntheticJob) -> Planned:
        if job.plan_ms:
            time.sleep(job.plan_ms / 1000)
        return Planned(remaining_units=job.units, unit_s=max(job.unit_ms / 1000, 1e-6),
                       plan={"kind": "synthetic", "units": job.units})

    def run_unit(self, *, trial_id: str, job: SyntheticJob, units_done: int, next_trial: str | None,
                 token: int, lane: int | None = None, expired: str = "") -> UnitDone:
        if job.unit_ms:
            time.sleep(job.unit_ms / 1000)
        if units_done == job.fail_at_unit:
            raise SyntheticUnitError(f"synthetic unit {units_done} of trial {trial_id!r} failed on purpose")
        left = job.units - units_done - 1
        return UnitDone(remaining_units=left, step=units_done, micro_batch=0, phase="synthetic", shard=0,
                        bytes_moved=0, peak_bytes=0, ready=[0] if left else [], ready_version=units_done + 1)

    def export(self, *, trial_id: str, job: SyntheticJob, export_dir: str) -> None:
        """A synthetic trial has no result to write."""

    def discard(self, *, trial_id: str) -> None:
        """A synthetic trial keeps no state outside the queue."""

    def checkpoints(self) -> list[CheckpointMetrics]:
        """A synthetic trial has no state to checkpoint."""
        return []
