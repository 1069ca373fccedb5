"""SHARP strong scaling: the same trials one after another on one device, then with SHARP on G devices.

`--trials` M tiny GPT-2 trials (different seeds and learning rates, several shards each) are first trained
one after another by the engine in this process on one CPU thread pinned to one core, the core the first
device worker is pinned to (the one-trial-at-a-time baseline, planning and export included). Then
`--devices` G CPU device workers of one thread each, each pinned to its own core (real Celery processes
under a throw-away host namespace of ``REDIS_URL``), train the same trials with SHARP, from submission to
the last export. Spill stores live on /dev/shm, the workers' default host tier (or ``--spill-dir``). Two cases run:
``identical`` (M trials of a 4-block width-192 model, 6 steps each; ``--quick``: 3) and ``heterogeneous``
(M trials of 2 to 6 blocks, widths 128 to 256 and 3 to 9 steps; ``--quick``: 2 to 5 steps), where
trials end at different times and the scheduler must keep every device busy as they do.

``--rounds`` R (default 5, quick 1) repeats each case's pair (sequential, SHARP), alternating, on the same
workers. Both the median and the best of the rounds are reported; the target is judged on the median.
The first round also pays the workers' first units (each process warms up on its own).

``hardware_speedup`` is the machine's own ceiling, measured in every round beside the trials: the same
single-threaded matmul work in G pinned processes at once versus in one (G x its time alone / their wall
time). Cores that are hyper-threads or share a memory bus give less than G, and no scheduler can beat that;
other load on a shared machine lowers it as it lowers SHARP. Target with M >= G: the median speedup >=
0.95 x the median hardware_speedup (``target_met``).

``split_speedup`` (when G divides M), also in every round: the identical case's trials one after another in one
pinned process against the same trials dealt out to G pinned processes at once, each training its share one
after another, with no scheduler and no queue. It is what G cores give the engine's own work on this machine
(matrix products, and the copies to and from the spill store that the two cores' caches and memory bandwidth
carry): the bound of SHARP's speedup on the identical case here, which the matmul ceiling overstates when the
engine's copies share the memory system less well than matrix products do. The identical case's
``speedup_of_split``: each round's SHARP speedup over that round's split_speedup (what the scheduler keeps of it).

Device time (G x SHARP wall time) is split into ``compute`` (units' time less their I/O), ``io`` (units
moving trial state between the device and the spill store: reads, waits for prefetched reads, writes,
commits), ``planning`` (profiling and planning trials) and ``idle`` (the rest: no unit running, the
scheduler's round trips, process overhead). A trial's export runs inside its last unit and counts as
compute there. ``unit_ms``: the median unit's milliseconds in that round (what a unit's fixed costs, a round trip
to Redis and the store taken and committed, are paid against). Figures: benchmarks/RESULTS.md.

The last line is one JSON object: ``{"devices", "trials", "hardware_speedup" {"median", "best"}, "split_speedup"
{"median", "best"}, "cases":
{case: {"rounds",
"sequential_s" {"median", "best"}, "sharp_s" {...}, "speedup" {...}, "speedup_of_hardware" {...},
"speedup_of_split" {...} (identical),
"device_time" {"compute", "io", "planning", "idle"} (shares of the median SHARP round), "unit_ms", "target_met"}}}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch

from benchmarks.local_workers import LocalWorkers
from worker import config
from worker.contract import EngineJob
from worker.devices import Device, cpu_cores
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, TrialSpec
from worker.engine.session import TrialSession, trial_create


def identical(tokens: Path, *, count: int, steps: int, budget_bytes: int) -> dict[str, TrialSpec]:
    """`count` trials of one shape and length, differing in seed and learning rate."""
    return {
        f"s{i}": TrialSpec(
            model=ModelSpec(n_layer=4, n_embd=192, n_head=4, vocab_size=256, n_positions=64, dropout=0.1),
            data=DataSpec(tokens_path=str(tokens), seq_len=64),
            optimizer=OptimizerSpec(lr=1e-3 * (1 + i)), batch_size=8, steps=steps, seed=i,
            budget_bytes=budget_bytes,
        )
        for i in range(count)
    }


def heterogeneous(tokens: Path, *, count: int, steps: int, budget_bytes: int) -> dict[str, TrialSpec]:
    """`count` trials of different depths, widths and lengths (`steps` is the shortest's length)."""
    shapes = [(2, 128), (6, 256), (4, 192), (3, 256), (5, 128), (2, 192)]
    return {
        f"h{i}": TrialSpec(
            model=ModelSpec(n_layer=shapes[i % len(shapes)][0], n_embd=shapes[i % len(shapes)][1], n_head=4,
                            vocab_size=256, n_positions=64, dropout=0.1),
            data=DataSpec(tokens_path=str(tokens), seq_len=64),
            optimizer=OptimizerSpec(lr=1e-3 * (1 + i)), batch_size=8, steps=steps + (i * 2) % 7, seed=i,
            budget_bytes=budget_bytes,
        )
        for i in range(count)
    }


CASES = {"identical": identical, "heterogeneous": heterogeneous}


@contextmanager
def pinned(cores: list[int]) -> Iterator[None]:
    """Run this process on `cores` only (as a CPU device worker is), then on what it had before."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def sequential(specs: dict[str, TrialSpec], root: Path) -> float:
    """Seconds to train every trial, one after another, on one thread of this process."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    for trial_id, spec in specs.items():
        trial_create(spec=spec, spill_dir=root / "spill", trial_id=trial_id, device=torch.device("cpu"))
        session = TrialSession.open(spill_dir=root / "spill", trial_id=trial_id, device=torch.device("cpu"))
        while session.next_unit() is not None:
            session.run_unit()
        session.export(root / "export" / trial_id)
    return time.perf_counter() - start


_MATMULS = """
import sys, time, torch
torch.set_num_threads(1)
width, iterations = int(sys.argv[1]), int(sys.argv[2])
x, w = torch.randn(512, width), torch.randn(width, 4 * width)
for _ in range(3):
    x @ w
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
for _ in range(iterations):
    x @ w
print(time.perf_counter() - start, flush=True)
"""


def pinned_runs(count: int, script: str, *args: str) -> list[float]:
    """Run `script` (``python -c``, with `args` and then its own index i) in `count` processes at once, process
    i pinned to the core of one-thread device worker i; each prints ``ready`` once set up, waits for a line,
    does its timed work and prints its seconds. They all start the timed work together: the seconds of each."""
    available = sorted(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", script, *args, str(i)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
                              preexec_fn=functools.partial(os.sched_setaffinity, 0, cpu_cores(i, 1, available)))
             for i in range(count)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return [float(proc.communicate()[0]) for proc in procs]


def hardware_speedup(devices: int, width: int) -> float:
    """G x (seconds of a fixed single-thread matmul loop alone) / (seconds of the slowest of G such loops
    started together, once every process has loaded torch); each process pinned like device worker i."""
    (probe,) = pinned_runs(1, _MATMULS, str(width), "50")
    iterations = max(50, int(50 * 3.0 / max(probe, 1e-3)))  # about 3 s of work per process
    (alone,) = pinned_runs(1, _MATMULS, str(width), str(iterations))
    return devices * alone / max(pinned_runs(devices, _MATMULS, str(width), str(iterations)))


# The sequential baseline's work for the identical case, cut into `parts` equal parts, one per process: this
# process's part (its index is the last argument), trained one trial after another on one thread.
_SPLIT = """
import sys
from pathlib import Path
from benchmarks.sharp_scaling import identical, sequential
tokens, count, steps, budget, root, parts, part = sys.argv[1:]
specs = identical(Path(tokens), count=int(count), steps=int(steps), budget_bytes=int(budget))
mine = dict(list(specs.items())[int(part)::int(parts)])
print("ready", flush=True)
sys.stdin.readline()
print(sequential(mine, Path(root) / f"part{part}-of-{parts}"), flush=True)
"""


def split_speedup(devices: int, tokens: Path, *, count: int, steps: int, budget_bytes: int, root: Path) -> float:
    """The identical case's trials one after another in one pinned process, against the same trials dealt out
    to G pinned processes at once (G x each's share, no scheduler, no queue): what G cores give the engine's
    own work on this machine, the bound of SHARP's speedup there (count a multiple of G)."""
    args = (str(tokens), str(count), str(steps), str(budget_bytes), str(root))
    (alone,) = pinned_runs(1, _SPLIT, *args, "1")
    return alone / max(pinned_runs(devices, _SPLIT, *args, str(devices)))


def sharp(workers: LocalWorkers, specs: dict[str, TrialSpec], export_root: Path) -> tuple[float, list[dict]]:
    """Seconds from submitting every trial to SHARP to the last one ending, and the units' spans."""
    start = workers.clock()
    for trial_id, spec in specs.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=spec), export_dir=str(export_root / trial_id))
    elapsed = workers.wait_until_ended(list(specs), timeout_s=1800) - start
    failed = [r.message for r in workers.queue.trials() if r.trial_id in specs and r.state != "finished"]
    if failed:
        raise SystemExit(f"trials failed: {failed}")
    return elapsed, [s for s in workers.entries("spans") if s["trial"] in specs]


def device_time(spans: list[dict], devices: int, wall_s: float) -> dict[str, float]:
    """Shares of G x `wall_s` spent computing, moving state, planning, and idle."""
    total = devices * wall_s
    planning = sum(float(s["end"]) - float(s["start"]) for s in spans if s["phase"] in ("plan", "replan"))
    units = [s for s in spans if s["phase"] not in ("plan", "replan")]
    io = sum(float(s.get("io_s") or 0.0) for s in units)
    compute = sum(float(s["end"]) - float(s["start"]) for s in units) - io
    return {"compute": round(compute / total, 3), "io": round(io / total, 3), "planning": round(planning / total, 3),
            "idle": round(1 - (compute + io + planning) / total, 3)}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "best": round(max(values), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="trials M per case (default 4)")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices G, one thread each (default 2)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per (shortest) trial (default 6)")
    parser.add_argument("--budget-mb", type=float, default=40, help="device budget per trial (default 40: "
                        "one block per shard at width 192)")
    parser.add_argument("--rounds", type=int, help="rounds of (sequential, SHARP) per case (default 5; quick 1)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help="3 steps per (shortest) trial, 1 round")
    parser.add_argument("--spill-dir", type=Path,
                        help="where the spill stores live (default /dev/shm; docs/operations.md#the-spill-volume)")
    args = parser.parse_args()
    if args.spill_dir is not None and not args.spill_dir.is_dir():
        parser.error(f"--spill-dir {args.spill_dir} is not a directory")
    steps = 3 if args.quick else args.steps
    rounds = args.rounds or (1 if args.quick else 5)
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        parser.error(f"unknown case(s) {sorted(unknown)}; use {', '.join(CASES)}")
    available = sorted(os.sched_getaffinity(0))
    baseline_cores = cpu_cores(0, 1, available)  # where device worker 0 runs

    # Spill stores on the host tier, /dev/shm, as a deployed worker keeps them (HYDRA_SPILL_DIR's default).
    host_tier = args.spill_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    runs: dict[str, list[tuple[float, float, list[dict]]]] = {case: [] for case in cases}
    ceilings: list[float] = []
    splits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="hydra-sharp-scaling-", dir=host_tier) as tmp:
        root = Path(tmp)
        tokens = root / "tokens.npy"
        np.save(tokens, np.random.default_rng(0).integers(0, 256, 1 << 16).astype(np.int32))
        devices = [Device("cpu", i, 1) for i in range(args.devices)]
        with LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=root / "sharp") as workers:
            # Rounds alternate, so that a slow spell of a shared machine does not land on one side only.
            for r in range(rounds):
                for case in cases:
                    specs = CASES[case](tokens, count=args.trials, steps=steps, budget_bytes=int(args.budget_mb * 1e6))
                    with pinned(baseline_cores):
                        sequential_s = sequential(specs, root / f"sequential-{case}-{r}")
                    sharp_s, spans = sharp(workers, {f"r{r}-{t}": spec for t, spec in specs.items()},
                                           root / "sharp" / "export")
                    runs[case].append((sequential_s, sharp_s, spans))
                    print(f"round {r + 1} {case}: sequential {sequential_s:.3f} s, SHARP {sharp_s:.3f} s, "
                          f"speedup {sequential_s / sharp_s:.3f}", file=sys.stderr)
                ceilings.append(hardware_speedup(args.devices, 192))
                print(f"round {r + 1}: hardware_speedup {ceilings[-1]:.3f}", file=sys.stderr)
                if args.trials % args.devices == 0:
                    splits.append(split_speedup(args.devices, tokens, count=args.trials, steps=steps,
                                                budget_bytes=int(args.budget_mb * 1e6), root=root / f"split-{r}"))
                    print(f"round {r + 1}: split_speedup {splits[-1]:.3f}", file=sys.stderr)

    ceiling = statistics.median(ceilings)
    results = {}
    for case, case_runs in runs.items():
        speedups = [seq / sharp_s for seq, sharp_s, _ in case_runs]
        median_run = sorted(case_runs, key=lambda run: run[0] / run[1])[len(case_runs) // 2]
        results[case] = {
            "rounds": len(case_runs),
            "sequential_s": {"median": round(statistics.median(r[0] for r in case_runs), 3),
                             "best": round(min(r[0] for r in case_runs), 3)},
            "sharp_s": {"median": round(statistics.median(r[1] for r in case_runs), 3),
                        "best": round(min(r[1] for r in case_runs), 3)},
            "speedup": summary(speedups),
            "speedup_of_hardware": summary([x / ceiling for x in speedups]),
            **({"speedup_of_split": summary([x / split for x, split in zip(speedups, splits, strict=True)])}
               if case == "identical" and splits else {}),
            "device_time": device_time(median_run[2], args.devices, median_run[1]),
            "unit_ms": round(1000 * statistics.median(float(s["end"]) - float(s["start"]) for s in median_run[2]
                                                      if s["phase"] not in ("plan", "replan")), 1),
            "target_met": statistics.median(speedups) >= 0.95 * ceiling,
        }
    print(json.dumps({"devices": args.devices, "trials": args.trials, "hardware_speedup": summary(ceilings),
                      **({"split_speedup": summary(splits)} if splits else {}), "cases": results}))


if __name__ == "__main__":
    main()
