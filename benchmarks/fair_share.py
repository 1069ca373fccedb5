"""Fair share between two teams on real device workers: each team's share of device time against its weight.

Team A submits 8 long trials; a few unit times later team B submits 4 short ones. `--devices` G CPU device
workers (real Celery processes under a throw-away host namespace of ``REDIS_URL``) run them with fair share
between the teams and Sharded-LRTF inside each (`worker.scheduling.fair_share`). The trials are synthetic
(each unit sleeps ``--unit-ms``): what is measured is the scheduler's division of device time, which does not
depend on what a unit computes, and sleeping units keep the two CPU devices from contending for cores.

Measured over the time both teams had runnable work (from B's first trial becoming runnable, at the end of
its planning, to the end of B's last unit): ``share_a`` and ``share_b``, each team's part of the device time
its units took; ``max_share_error``, the largest gap between a share and the team's weight ÷ the weights'
sum; ``wait_b_units``, B's wait from becoming runnable to its first unit, in unit times; ``utilization``,
device time in units or planning ÷ (G x the window). One run per weight ratio (``--weights``, default 1:1 and
3:1). Targets: ``max_share_error`` <= 0.05, ``utilization`` >= 0.9, ``wait_b_units`` <= 1.

The last line is one JSON object: ``{"runs": [{"weights", "share_a", "share_b", "max_share_error",
"wait_b_units", "utilization"}...], "device"}``, with the worst figure of the runs at the top level under the
same names. Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.local_workers import LocalWorkers
from worker import config
from worker.contract import SyntheticJob
from worker.devices import Device


def one_run(workers: LocalWorkers, weights: tuple[float, float], *, unit_ms: float, long_units: int,
            short_units: int, run: int) -> dict[str, object]:
    """Submit A's 8 long trials, then B's 4 short ones after a few units; measure while both have work."""
    a = [f"r{run}-a{i}" for i in range(8)]
    b = [f"r{run}-b{i}" for i in range(4)]
    workers.queue.set_weights({"A": weights[0], "B": weights[1]})
    for trial_id in a:
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=long_units, unit_ms=unit_ms), export_dir="",
                             team="A")
    time.sleep(5 * unit_ms / 1000)
    for trial_id in b:
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=short_units, unit_ms=unit_ms), export_dir="",
                             team="B")
    workers.wait_until_ended(a + b, timeout_s=1800)
    spans = [s for s in workers.entries("spans") if s["trial"] in a + b]
    units = [s for s in spans if s["phase"] not in ("plan", "replan")]
    start = min(float(s["end"]) for s in spans if s["trial"] in b and s["phase"] == "plan")
    end = max(float(s["end"]) for s in units if s["trial"] in b)

    def inside(span: dict) -> float:
        return max(0.0, min(float(span["end"]), end) - max(float(span["start"]), start))

    time_a = sum(inside(s) for s in units if s["trial"] in a)
    time_b = sum(inside(s) for s in units if s["trial"] in b)
    busy = sum(inside(s) for s in spans)
    share_a, share_b = time_a / (time_a + time_b), time_b / (time_a + time_b)
    target_a = weights[0] / sum(weights)
    first_b = min(float(s["start"]) for s in units if s["trial"] in b)
    return {
        "weights": list(weights), "share_a": round(share_a, 3), "share_b": round(share_b, 3),
        "max_share_error": round(max(abs(share_a - target_a), abs(share_b - (1 - target_a))), 3),
        "wait_b_units": round(max(0.0, first_b - start) / (unit_ms / 1000), 2),
        "utilization": round(busy / (len(workers.devices) * (end - start)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU devices G (default 2)")
    parser.add_argument("--unit-ms", type=float, default=100.0, help="each unit's length (default 100 ms)")
    parser.add_argument("--weights", default="1:1,3:1", help="A:B weight ratios, comma-separated (default 1:1,3:1)")
    parser.add_argument("--quick", action="store_true", help="shorter trials (A: 60 units, B: 15)")
    args = parser.parse_args()
    long_units, short_units = (60, 15) if args.quick else (200, 50)
    ratios = [tuple(float(x) for x in pair.split(":")) for pair in args.weights.split(",") if pair]
    if any(len(r) != 2 or min(r) <= 0 for r in ratios):
        parser.error("--weights takes ratios such as 1:1,3:1 of positive numbers")
    runs = []
    with tempfile.TemporaryDirectory(prefix="hydra-fair-share-") as tmp:
        devices = [Device("cpu", i, 1) for i in range(args.devices)]
        with LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=Path(tmp)) as workers:
            for run, weights in enumerate(ratios):
                runs.append(one_run(workers, weights, unit_ms=args.unit_ms, long_units=long_units,  # type: ignore[arg-type]
                                    short_units=short_units, run=run))
                print(json.dumps(runs[-1]), file=sys.stderr)
    print(json.dumps({
        "runs": runs, "max_share_error": max(r["max_share_error"] for r in runs),  # type: ignore[type-var]
        "wait_b_units": max(r["wait_b_units"] for r in runs),  # type: ignore[type-var]
        "utilization": min(r["utilization"] for r in runs),  # type: ignore[type-var]
        "device": f"{args.devices} x cpu (synthetic units of {args.unit_ms:g} ms)",
    }))


if __name__ == "__main__":
    main()
