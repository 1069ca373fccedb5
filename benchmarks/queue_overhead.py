"""What the shard task queue costs per unit: units that do no work, through the real queue and workers.

Starts `--devices` CPU device workers (real Celery processes, as ``python -m worker.launch`` would) under a
throw-away host namespace of the configured Redis (``REDIS_URL``), submits `--trials` synthetic trials of
`--units` empty units each, and measures on every device the time from one unit's start to the next one's:
with no work in the unit, that is the scheduler's whole cycle (survey, claim, lease keeper, complete with
its telemetry). Defaults: 2 devices, 4 trials x 500 units; ``--quick``: 4 x 100.

The last line is one JSON object: ``{"units", "p50_ms", "p99_ms", "target_met"}``. Target: p50 under 2 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.local_workers import LocalWorkers
from worker import config
from worker.contract import SyntheticJob
from worker.devices import Device

TARGET_P50_MS = 2.0


def unit_cycles_ms(spans: list[dict[str, object]]) -> list[float]:
    """Start-to-start times of consecutive units on each device, in milliseconds."""
    cycles = []
    for device in {s["device"] for s in spans}:
        starts = sorted(float(s["start"]) for s in spans if s["device"] == device)
        cycles += [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    return cycles


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU device workers (default 2)")
    parser.add_argument("--trials", type=int, default=4, help="synthetic trials (default 4)")
    parser.add_argument("--units", type=int, default=500, help="empty units per trial (default 500)")
    parser.add_argument("--quick", action="store_true", help="100 units per trial")
    args = parser.parse_args()
    units = 100 if args.quick else args.units

    devices = [Device("cpu", i, 1) for i in range(args.devices)]
    with tempfile.TemporaryDirectory(prefix="hydra-queue-overhead-") as root, \
            LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=Path(root)) as workers:
        trial_ids = [f"q{i}" for i in range(args.trials)]
        start = time.monotonic()
        for trial_id in trial_ids:
            workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=units), export_dir="")
        workers.wait_until_ended(trial_ids, timeout_s=600)
        elapsed = time.monotonic() - start
        spans = [s for s in workers.entries("spans") if s["phase"] != "plan"]

    cycles = unit_cycles_ms(spans)
    print(f"devices {args.devices}, trials {args.trials} x {units} units, {elapsed:.2f} s in all, "
          f"{len(spans) / elapsed:.0f} units/s, mean cycle {statistics.fmean(cycles):.3f} ms")
    p50 = percentile(cycles, 0.5)
    print(json.dumps({"units": len(spans), "p50_ms": round(p50, 3), "p99_ms": round(percentile(cycles, 0.99), 3),
                      "target_met": p50 < TARGET_P50_MS}))


if __name__ == "__main__":
    main()
