"""What the shard task queue costs per unit: units that do no work, through the real queue and workers.

Starts `--devices` CPU device workers (real Celery processes, as ``python -m worker.launch`` would) under a
throw-away host namespace of the configured Redis (``REDIS_URL``), submits `--trials` synthetic trials of
empty units, and measures on every device the time from one unit's start to the next one's: with no work
in the unit, that is the scheduler's whole cycle (survey, claim, lease keeper, complete with its
telemetry).

Planning is measured apart, first: the trials are submitted paused, so each is planned and then waits; once
all are, they are resumed in one round trip and the devices run their units with every trial runnable,
which is the queue the unit cycle must not grow with. `plan_p50_ms` is the median time from a plan's start
to the device's next start (the plan, its claim and its report). Were the trials planned while units ran,
nearly every unit would share the cores and Redis with another device's planning, and the figure would be
planning's, not the queue's. Unit cycles that still overlap a plan on another device are reported apart
(`beside_planning_p50_ms`, null when none), and `p50_ms`/`p99_ms` are those of the others.

The same 2,000 units (`--units` in all) are run twice in this script: as `--trials` trials, then as 4
trials, the baseline; the unit cycle must not grow with the number of trials in the queue. Defaults: 2
devices, 1,000 trials of 2 units; ``--quick``: 400 units as 100 trials of 4.

``--in-process`` runs one device loop in this process instead, against the same Redis, with every trial
planned first: the cycle without a second device or Celery around it, and what it costs in CPU, the loop's
(``loop_cpu_ms``) and Redis's (``redis_cpu_ms``, from its ``INFO cpu``, so nothing else may use that Redis
meanwhile) per unit. It shows where the time goes on a host of few cores, where the two share them.

The last line is one JSON object: ``{"trials", "units", "p50_ms", "p99_ms", "plan_p50_ms",
"beside_planning_p50_ms", "baseline_p50_ms", "ratio", "target_met"}``. Target: ratio (p50 against the
4-trial p50) at most 1.2, both p50 under 1 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.local_workers import LocalWorkers
from worker import config
from worker.contract import SyntheticJob
from worker.devices import Device
from worker.scheduling.device_loop import DeviceLoop, DeviceLoopConfig
from worker.scheduling.queue import ShardQueue
from worker.scheduling.synthetic import SyntheticRunner

TARGET_P50_MS = 1.0
TARGET_RATIO = 1.2
BASELINE_TRIALS = 4


def unit_cycles_ms(spans: list[dict[str, object]]) -> tuple[list[float], list[float], list[float]]:
    """Start-to-start times on each device, in milliseconds: of consecutive units while no device plans, of
    consecutive units while another device plans (they share the cores and Redis with it), and from each
    plan to whatever the device started next."""
    planning = sorted((float(s["start"]), float(s["end"])) for s in spans if s["phase"] == "plan")
    cycles, beside, plans = [], [], []
    for device in {s["device"] for s in spans}:
        mine = sorted((s for s in spans if s["device"] == device), key=lambda s: float(s["start"]))
        for a, b in itertools.pairwise(mine):
            start, end = float(a["start"]), float(b["start"])
            gap = (end - start) * 1000
            if a["phase"] == "plan":
                plans.append(gap)
            elif b["phase"] != "plan":
                overlaps = any(p_start < end and start < p_end for p_start, p_end in planning)
                (beside if overlaps else cycles).append(gap)
    return cycles, beside, plans


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(devices: list[Device], trials: int, units: int) -> dict[str, float]:
    """Run `units` empty units as `trials` trials; the unit cycle's p50 and p99 and the plan cycle's p50."""
    per_trial = max(1, units // trials)
    with tempfile.TemporaryDirectory(prefix="hydra-queue-overhead-") as root, \
            LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=Path(root)) as workers:
        trial_ids = [f"q{i}" for i in range(trials)]
        for trial_id in trial_ids:
            workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=per_trial), export_dir="", paused=True)
        workers.wait_for_states(trial_ids, {"paused"}, timeout_s=900)
        start = workers.clock()
        workers.queue.resume_all(trial_ids)
        elapsed = workers.wait_until_ended(trial_ids, timeout_s=900) - start
        spans = workers.entries("spans")
    cycles, beside, plans = unit_cycles_ms(spans)
    done = sum(s["phase"] != "plan" for s in spans)
    print(f"devices {len(devices)}, trials {trials} x {per_trial} units, {elapsed:.2f} s in all, "
          f"{done / elapsed:.0f} units/s, mean cycle {statistics.fmean(cycles):.3f} ms, {len(plans)} plans")
    return {"units": done, "p50_ms": percentile(cycles, 0.5), "p99_ms": percentile(cycles, 0.99),
            "plan_p50_ms": percentile(plans, 0.5),
            "beside_planning_p50_ms": round(percentile(beside, 0.5), 3) if beside else None}


def measure_in_process(trials: int, units: int) -> dict[str, float]:
    """Run `units` empty units as `trials` trials on one device loop in this process: per-turn p50 and p99,
    and the loop's and Redis's CPU per unit."""
    client = redis.Redis.from_url(config.current().redis_url, decode_responses=True)
    queue = ShardQueue(client, f"bench-{uuid.uuid4().hex[:10]}")
    queue.device_start("cpu0", "bench")
    loop = DeviceLoop(queue=queue, runners={"synthetic": SyntheticRunner()},
                      config=DeviceLoopConfig(device="cpu0", epoch="bench", idle_wait_s=0.01))
    try:
        trial_ids = [f"q{i}" for i in range(trials)]
        for trial_id in trial_ids:
            queue.submit(trial_id=trial_id, job=SyntheticJob(units=max(1, units // trials)), export_dir="",
                         paused=True)
        while "planning" in queue.states().values():
            loop.turn()
        queue.resume_all(trial_ids)
        turns: list[float] = []
        cpu, redis_cpu = time.process_time(), _redis_cpu_s(client)
        while len(turns) < units - trials:  # each trial's last unit is not followed by one of its own
            start = time.perf_counter()
            loop.turn()
            turns.append((time.perf_counter() - start) * 1000)
        cpu, redis_cpu = time.process_time() - cpu, _redis_cpu_s(client) - redis_cpu
    finally:
        loop.keeper.stop()
        keys = list(client.scan_iter(match=f"*{queue.host_id}*", count=1000))
        if keys:
            client.delete(*keys)
    print(f"in process, trials {trials}: turn p50 {percentile(turns, 0.5):.3f} ms, loop CPU "
          f"{cpu / len(turns) * 1000:.3f} ms, Redis CPU {redis_cpu / len(turns) * 1000:.3f} ms per unit")
    return {"units": len(turns), "p50_ms": percentile(turns, 0.5), "p99_ms": percentile(turns, 0.99),
            "loop_cpu_ms": cpu / len(turns) * 1000, "redis_cpu_ms": redis_cpu / len(turns) * 1000}


def _redis_cpu_s(client: redis.Redis) -> float:
    stats = client.info("cpu")
    return float(stats["used_cpu_user"]) + float(stats["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU device workers (default 2)")
    parser.add_argument("--trials", type=int, default=1000, help="synthetic trials (default 1000)")
    parser.add_argument("--units", type=int, default=2000, help="empty units in all (default 2000)")
    parser.add_argument("--quick", action="store_true", help="400 units as 100 trials")
    parser.add_argument("--in-process", action="store_true", help="one device loop in this process, with CPU")
    args = parser.parse_args()
    trials, units = (100, 400) if args.quick else (args.trials, args.units)
    if args.in_process:
        many, baseline = measure_in_process(trials, units), measure_in_process(BASELINE_TRIALS, units)
        ratio = many["p50_ms"] / baseline["p50_ms"]
        print(json.dumps({"trials": trials, **{key: round(value, 3) for key, value in many.items()},
                          **{f"baseline_{key}": round(value, 3) for key, value in baseline.items() if key != "units"},
                          "ratio": round(ratio, 3), "target_met": ratio <= TARGET_RATIO
                          and max(many["p50_ms"], baseline["p50_ms"]) < TARGET_P50_MS}))
        return

    devices = [Device("cpu", i, 1) for i in range(args.devices)]
    many = measure(devices, trials, units)
    baseline = measure(devices, BASELINE_TRIALS, units)
    ratio = many["p50_ms"] / baseline["p50_ms"]
    print(json.dumps({"trials": trials, "units": many["units"], "p50_ms": round(many["p50_ms"], 3),
                      "p99_ms": round(many["p99_ms"], 3), "plan_p50_ms": round(many["plan_p50_ms"], 3),
                      "beside_planning_p50_ms": many["beside_planning_p50_ms"],
                      "baseline_p50_ms": round(baseline["p50_ms"], 3), "ratio": round(ratio, 3),
                      "target_met": ratio <= TARGET_RATIO and max(many["p50_ms"], baseline["p50_ms"]) < TARGET_P50_MS}))


if __name__ == "__main__":
    main()
