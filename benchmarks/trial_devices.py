"""One trial on one device and on two: how much a wavefront of micro-batches speeds up a lone trial.

One spilled Llama-shaped trial (SmolLM2-135M's layers, width and heads, a 16,384-token vocabulary so that CPU
steps stay short; ``--quick``: 8 layers, width 256) with ``--micro-batches`` (default 4) micro-batches a step
trains to its end on real CPU device workers of one thread each (Celery processes under a throw-away host
namespace of ``REDIS_URL``, spill stores on /dev/shm or ``--spill-dir``): first with one device worker, then with
two, where the scheduler runs the step's micro-batches on both devices at once as a wavefront (no other trial
waits, so the second device takes a second lane of the same trial). Rounds alternate one and two devices.

``speedup`` = one device's wall time / two devices' (median over the rounds, from submission to the end of the
export), ``ceiling`` = the machine's own speedup of the same single-threaded matmul work in two pinned processes
against one (as `sharp_scaling.py` measures it, in every round), ``of_ceiling`` = speedup / ceiling;
``identical``: the final weights of the one-device and the two-device runs compared with ``torch.equal`` (every
tensor). Targets: speedup >= 1.7 and >= 0.9 x ceiling.

``training_ceiling``: the same comparison for the trial's model trained resident in plain PyTorch
(transformers' Llama of the engine's config, AdamW, the trial's batches and micro-batches, as
`spill_overhead.py`'s resident run; one step after a warm-up), in two pinned processes at
once against one, in every round. The matmul ceiling leaves out what two cores share besides their own work
(caches, memory bandwidth); this one shows what they leave of this model's training, without spilling.

``step_s``: the median wall seconds of a step in the steady state (neither the first two steps nor the last, so
only with ``--steps`` 4 or more) on one device and on two, and ``step_speedup`` their ratio: what a wavefront
gains a step once a trial's costs paid once (planning, the first steps' warm-up, the final updates, export and
last checkpoint) are left aside, as in a long trial. ``step_units_s``: the seconds such a step's units took on
all devices together, less their I/O (``compute``) and their I/O with the store (``io``), on one device and on
two (medians): where two devices at once make the same units slower. ``step_busy``: the two devices' unit
seconds over twice the step's wall time (what the scheduler left idle is the rest). ``devices_at_once``: the most
units of the trial that overlapped in time in the median two-device run (2 when the wavefront ran).

With a budget that holds the whole model (``--budget-mb 4000``: one shard), a step is one unit per micro-batch, all
of them side by side, then one ``S`` unit that applies the step's update alone (the step's serial part):
``step_update_s`` gives its seconds in the steady state, with its I/O, on one device and on two (medians; only
for such a trial). ``shards``: the shards the trial was planned in.

The last line is one JSON object: ``{"shape", "micro_batches", "shards", "rounds",
"one_device_s", "two_devices_s",
"speedup", "ceiling", "of_ceiling", "training_ceiling", "step_s", "step_speedup", "step_units_s" {"one", "two":
{"compute", "io"}}, "step_busy", "step_update_s" {"one", "two": {"unit", "io"}}, "identical", "devices_at_once",
"target_met"}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch
from safetensors.torch import load_file

from benchmarks.local_workers import LocalWorkers
from benchmarks.sharp_scaling import hardware_speedup, pinned_runs
from worker import config
from worker.contract import EngineJob
from worker.devices import Device
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec

SHAPE = {"layers": 30, "width": 576, "heads": 9, "kv_heads": 3, "inner": 1536, "vocab": 16384, "seq_len": 128}
QUICK = SHAPE | {"layers": 8, "width": 256, "heads": 4, "kv_heads": 2, "inner": 512, "vocab": 4096, "seq_len": 64}
TARGET_SPEEDUP, TARGET_OF_CEILING = 1.7, 0.9


def trial(tokens: Path, shape: dict[str, int], *, micro_batches: int, steps: int, budget_bytes: int) -> TrialSpec:
    return TrialSpec(
        model=ModelSpec(family="llama", n_layer=shape["layers"], n_embd=shape["width"], n_head=shape["heads"],
                        n_kv_head=shape["kv_heads"], n_inner=shape["inner"], vocab_size=shape["vocab"],
                        n_positions=shape["seq_len"], dropout=0.0),
        data=DataSpec(tokens_path=str(tokens), seq_len=shape["seq_len"]),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-3, weight_decay=0.1, clip_norm=1.0),
        schedule=ScheduleSpec(warmup_steps=1, decay="cosine"),
        batch_size=2 * micro_batches, micro_batches=micro_batches, steps=steps, eval_every=0, seed=3,
        budget_bytes=budget_bytes,
    )


# One process's plain PyTorch training of a trial's model, everything resident (`spill_overhead.resident_trainer`):
# step 0 untimed (it allocates AdamW's moments), then the steps asked for.
_TRAINING = """
import json, sys, time, torch
from benchmarks.spill_overhead import resident_trainer
from worker.engine.config import TrialSpec
torch.set_num_threads(1)
spec, steps = TrialSpec.from_dict(json.loads(sys.argv[1])), int(sys.argv[2])
step = resident_trainer(spec, torch.device("cpu"))
step(0)
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
for n in range(1, 1 + steps):
    step(n)
print(time.perf_counter() - start, flush=True)
"""


def training_speedup(spec: TrialSpec, steps: int = 1) -> float:
    """2 x (seconds of `steps` steps of `spec`'s model trained resident in plain PyTorch, one process alone) /
    (seconds of the slower of two such processes at once); each on one thread, pinned like device worker i. What
    two cores give this model's own training on this machine, where the matmul `ceiling` leaves aside what the
    two share besides the cores (memory bandwidth, caches)."""
    args = (json.dumps(spec.to_dict()), str(steps))
    (alone,) = pinned_runs(1, _TRAINING, *args)
    return 2 * alone / max(pinned_runs(2, _TRAINING, *args))


def train(workers: LocalWorkers, trial_id: str, spec: TrialSpec, export: Path) -> tuple[float, list[dict]]:
    """Seconds from submission to the end of the trial's export, and its units' spans."""
    start = workers.clock()
    workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=spec), export_dir=str(export))
    elapsed = workers.wait_until_ended([trial_id], timeout_s=3600) - start
    (record,) = [r for r in workers.queue.trials() if r.trial_id == trial_id]
    if record.state != "finished":
        raise SystemExit(f"trial {trial_id} {record.state}: {record.message}")
    return elapsed, [s for s in workers.entries("spans") if s["trial"] == trial_id and s["phase"] != "plan"]


def at_once(spans: list[dict]) -> int:
    """The most spans that overlap in time."""
    edges = sorted([(float(s["start"]), 1) for s in spans] + [(float(s["end"]), -1) for s in spans])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def step_seconds(spans: list[dict]) -> list[float]:
    """Wall seconds of each step of the steady state (from its first unit's start to the next step's): neither
    of the first two steps (the first warms up; the second's units apply the first optimizer updates and write
    the AdamW moments for the first time) nor the last (the final updates and the export)."""
    starts = {}
    for span in spans:
        step = int(span["step"])
        starts[step] = min(starts.get(step, float("inf")), float(span["start"]))
    steps = sorted(starts)
    return [starts[b] - starts[a] for a, b in itertools.pairwise(steps[2:])]


def steady_units(spans: list[dict]) -> list[tuple[float, float]]:
    """Per step of the steady state (those `step_seconds` times), the seconds its units took on all devices
    together, less their I/O, and their I/O (reads, waits for them, writes, commits)."""
    steps = sorted({int(span["step"]) for span in spans})[2:-1]
    return [(sum(float(s["end"]) - float(s["start"]) - float(s.get("io_s") or 0) for s in mine),
             sum(float(s.get("io_s") or 0) for s in mine))
            for mine in ([s for s in spans if int(s["step"]) == step] for step in steps)]


def steady_updates(spans: list[dict]) -> list[tuple[float, float]]:
    """The seconds and the I/O seconds of the ``S`` units of the steps `step_seconds` times (a one-shard trial's
    updates)."""
    steps = sorted({int(span["step"]) for span in spans})[2:-1]
    return [(float(s["end"]) - float(s["start"]), float(s.get("io_s") or 0))
            for s in spans if s["phase"] == "S" and int(s["step"]) in steps]


def units_summary(units: list[tuple[float, float]]) -> dict[str, float]:
    """The medians of `steady_units`' compute and I/O seconds."""
    return {"compute": round(statistics.median(c for c, _ in units), 3),
            "io": round(statistics.median(i for _, i in units), 3)}


def update_summary(updates: list[tuple[float, float]]) -> dict[str, float]:
    """The medians of `steady_updates`' unit and I/O seconds."""
    return {"unit": round(statistics.median(u for u, _ in updates), 3),
            "io": round(statistics.median(i for _, i in updates), 3)}


def weights(export: Path) -> dict[str, torch.Tensor]:
    return {name: tensor for path in sorted(export.glob("*.safetensors")) for name, tensor in load_file(path).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches a step (default 4)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3; quick 2)")
    parser.add_argument("--rounds", type=int, help="rounds of (one device, two devices) (default 3; quick 1)")
    parser.add_argument("--budget-mb", type=float, default=200,
                        help="device budget (default 200: several shards, room for the embedding with its gradient; "
                             "4000: one shard)")
    parser.add_argument("--quick", action="store_true", help="a small shape, 2 steps, 1 round")
    parser.add_argument("--spill-dir", type=Path,
                        help="where the spill stores live (default /dev/shm; docs/operations.md#the-spill-volume)")
    args = parser.parse_args()
    if args.spill_dir is not None and not args.spill_dir.is_dir():
        parser.error(f"--spill-dir {args.spill_dir} is not a directory")
    shape = QUICK if args.quick else SHAPE
    steps = args.steps if not args.quick else 2
    rounds = args.rounds or (1 if args.quick else 3)
    host_tier = args.spill_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    one_s, two_s, ceilings, trainings, overlaps, identical, shards = [], [], [], [], [], True, 0
    one_step_s, two_step_s, one_units, two_units, one_updates, two_updates = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="hydra-trial-devices-", dir=host_tier) as tmp:
        root = Path(tmp)
        tokens = root / "tokens.npy"
        np.save(tokens, np.random.default_rng(0).integers(0, shape["vocab"], 1 << 16).astype(np.int32))
        spec = trial(tokens, shape, micro_batches=args.micro_batches, steps=steps,
                     budget_bytes=int(args.budget_mb * 1e6))
        redis_url = config.current().redis_url
        for r in range(rounds):
            runs = {}
            for count in (1, 2):
                devices = [Device("cpu", i, 1) for i in range(count)]
                with LocalWorkers(devices=devices, redis_url=redis_url, root=root / f"r{r}-{count}") as workers:
                    export = root / f"export-{r}-{count}"
                    seconds, spans = train(workers, f"r{r}-d{count}", spec, export)
                runs[count] = (seconds, spans, export)
                print(f"round {r + 1}: {count} device(s) {seconds:.2f} s, {at_once(spans)} units at once at most",
                      file=sys.stderr)
            shards = 1 + max(int(span["shard"]) for span in runs[1][1])
            one_s.append(runs[1][0])
            two_s.append(runs[2][0])
            overlaps.append(at_once(runs[2][1]))
            one_step_s += step_seconds(runs[1][1])
            two_step_s += step_seconds(runs[2][1])
            one_units += steady_units(runs[1][1])
            two_units += steady_units(runs[2][1])
            one_updates += steady_updates(runs[1][1])
            two_updates += steady_updates(runs[2][1])
            a, b = weights(runs[1][2]), weights(runs[2][2])
            identical &= a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            for count in (1, 2):  # each run leaves gigabytes in host memory (its export and last checkpoint)
                shutil.rmtree(runs[count][2])
                shutil.rmtree(root / f"r{r}-{count}")
            ceilings.append(hardware_speedup(2, 192))
            trainings.append(training_speedup(spec))
            print(f"round {r + 1}: ceiling {ceilings[-1]:.3f}, training_ceiling {trainings[-1]:.3f}", file=sys.stderr)
    speedup = statistics.median(one_s) / statistics.median(two_s)
    ceiling = statistics.median(ceilings)
    print(json.dumps({
        "shape": "quick" if args.quick else "smollm2-135m-layers", "micro_batches": args.micro_batches,
        "shards": shards,
        "rounds": rounds, "one_device_s": round(statistics.median(one_s), 3),
        "two_devices_s": round(statistics.median(two_s), 3), "speedup": round(speedup, 3),
        "ceiling": round(ceiling, 3), "of_ceiling": round(speedup / ceiling, 3),
        "training_ceiling": round(statistics.median(trainings), 3),
        **({"step_s": [round(statistics.median(one_step_s), 3), round(statistics.median(two_step_s), 3)],
            "step_speedup": round(statistics.median(one_step_s) / statistics.median(two_step_s), 3),
            "step_units_s": {"one": units_summary(one_units), "two": units_summary(two_units)},
            "step_busy": round(sum(units_summary(two_units).values()) / (2 * statistics.median(two_step_s)), 3)}
           if one_step_s and two_step_s else {}),
        **({"step_update_s": {"one": update_summary(one_updates), "two": update_summary(two_updates)}}
           if one_updates and two_updates else {}),
        "identical": identical,
        "devices_at_once": max(overlaps),
        "target_met": identical and speedup >= TARGET_SPEEDUP and speedup >= TARGET_OF_CEILING * ceiling,
    }))


if __name__ == "__main__":
    main()
