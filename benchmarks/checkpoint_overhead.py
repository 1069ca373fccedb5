"""What durable checkpoints cost a spilled trial: the same trial trained by the engine runner with checkpoints
off, at the default interval, and at an interval short enough to take several during the run, in one process.

Each copy runs unit after unit through one `EngineRunner` as a device worker runs it (a snapshot between
two units, the copy to disk in the runner's background thread while units go on), with the spill store on
``--spill-dir`` (the host tier, /dev/shm) and checkpoints on ``--checkpoint-dir`` (a disk; default a
temporary directory under the working directory). The three copies' units take turns (in a rotating
order), so that the load of a shared machine slows each alike; throughput is tokens over the time of a
copy's units (planning and the export, with its final checkpoint, are not timed), best of rounds after an
untimed warm-up run. The short
interval is a fifth of a copy's time to finish among the three, so that about four checkpoints are taken;
its background copy runs while all three copies' units run, so its cost is shared among them and its ratio
is an upper bound.

At the default interval (30 minutes) a run shorter than that takes no checkpoint, and the ratio measures
only the check after each unit. ``projected_ratio`` is what one checkpoint every default interval costs a
run of any length, from a snapshot's measured time (the trial stops only for that);
``projected_ratio_copy_not_overlapped`` also counts the copy's time, as if it stopped the trial too.

Defaults: the spill_overhead ``--quick`` shape (12 layers, width 256, 1024 vocabulary, 8 x 64 tokens per step
in 4 micro-batches), 6 steps, budget a quarter of the training state, 2 rounds (``--quick``: width 128, 4
steps, one round). The last line is one JSON object: ``{"interval_s", "checkpoints", "ratio",
"checkpoint_bytes", "device", "projected_ratio", "projected_ratio_copy_not_overlapped", "snapshot_s",
"write_s", "short": {"interval_s", "checkpoints", "ratio"}, "tokens_per_s", "target_met"}``; ratios are
throughput with checkpoints over throughput without. Target: ratio >= 0.98 at the default interval.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from worker.contract import DEFAULT_CHECKPOINT_MINUTES, EngineJob
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec, durable
from worker.engine.layers import gpt2_config
from worker.scheduling.engine_runner import EngineRunner
from worker.scheduling.runner import UnitDone

SHAPE = {"layers": 12, "width": 256, "heads": 4, "vocab": 1024, "seq_len": 64, "batch": 8, "micro_batches": 4,
         "steps": 6, "rounds": 2}
QUICK = {"width": 128, "steps": 4, "rounds": 1}
TARGET = 0.98


def interleaved(spec: TrialSpec, spill: Path, disk: Path, device: torch.device,
                minutes: dict[str, float]) -> dict[str, dict]:
    """Train one copy of `spec` per entry of `minutes` (its checkpoint interval; 0: none) through one runner,
    their units taking turns, so that the machine's load changes slow every copy alike: per copy the
    seconds of its units and the checkpoints written during them; then, on the last copy's store, the
    seconds of one snapshot (what a checkpoint stops the trial for) and of writing it (in the background)."""
    runner = EngineRunner(spill_dir=spill, device=device, checkpoint_dir=disk / "checkpoints")
    jobs = {name: EngineJob(trial=spec, checkpoint_minutes=m) for name, m in minutes.items()}
    left = {name: runner.plan(trial_id=name, job=job).remaining_units for name, job in jobs.items()}
    seconds = dict.fromkeys(jobs, 0.0)
    done = dict.fromkeys(jobs, 0)
    order = list(jobs)
    while any(left.values()):
        order = order[1:] + order[:1]  # each copy's units follow each other copy's in turn
        for name in order:
            job = jobs[name]
            if not left[name]:
                continue
            start = time.perf_counter()
            out = runner.run_unit(trial_id=name, job=job, units_done=done[name], next_trial=name, token=1)
            seconds[name] += time.perf_counter() - start
            assert isinstance(out, UnitDone)
            left[name], done[name] = out.remaining_units, done[name] + 1
    runner.wait_for_checkpoints()
    written = runner.checkpoints()
    last = list(jobs)[-1]
    start = time.perf_counter()
    held = durable.snapshot(spill_dir=spill, checkpoint_dir=disk / "extra", trial_id=last)
    assert held is not None
    snapshot_s = time.perf_counter() - start
    info = held.write()
    write_s = time.perf_counter() - start - snapshot_s
    for name, job in jobs.items():
        runner.export(trial_id=name, job=job, export_dir=str(disk / "export" / name))
    runner.wait_for_checkpoints()
    runner.checkpoints()
    for path in ("export", "checkpoints", "extra"):
        shutil.rmtree(disk / path, ignore_errors=True)
    return {name: {"seconds": seconds[name], "checkpoints": sum(c.trial == name for c in written),
                   "bytes": info.bytes, "snapshot_s": snapshot_s, "write_s": write_s} for name in jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="width 128, 4 steps, one round (make benchmarks)")
    parser.add_argument("--steps", type=int, help=f"optimizer steps per run (default {SHAPE['steps']})")
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds, best kept (default {SHAPE['rounds']})")
    parser.add_argument("--layers", type=int, default=SHAPE["layers"])
    parser.add_argument("--width", type=int, help=f"model width (default {SHAPE['width']})")
    parser.add_argument("--budget-fraction", type=float, default=0.25, help="budget as a share of the state")
    parser.add_argument("--spill-dir", type=Path, default=Path("/dev/shm"), help="where the spill store lives")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path.cwd(), help="a disk directory for checkpoints")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, a CPU device's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else SHAPE).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    spill_root = Path(tempfile.mkdtemp(prefix="hydra-ckpt-bench-", dir=args.spill_dir))
    disk_root = Path(tempfile.mkdtemp(prefix="hydra-ckpt-bench-", dir=args.checkpoint_dir))
    try:
        np.save(disk_root / "tokens.npy",
                np.random.default_rng(0).integers(0, SHAPE["vocab"], SHAPE["seq_len"] * 256, dtype=np.int32))
        model = ModelSpec(n_layer=args.layers, n_embd=args.width, n_head=SHAPE["heads"], vocab_size=SHAPE["vocab"],
                          n_positions=SHAPE["seq_len"], dropout=0.1)
        with torch.device("meta"):
            n_params = sum(p.numel() for p in GPT2LMHeadModel(gpt2_config(model)).parameters())
        spec = TrialSpec(
            model=model, data=DataSpec(tokens_path=str(disk_root / "tokens.npy"), seq_len=SHAPE["seq_len"]),
            optimizer=OptimizerSpec(kind="adamw", lr=1e-4, clip_norm=1.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=SHAPE["batch"], micro_batches=SHAPE["micro_batches"], steps=args.steps, eval_every=0,
            budget_bytes=int(n_params * 16 * args.budget_fraction), seed=0,
        )
        tokens = args.steps * SHAPE["batch"] * SHAPE["seq_len"]
        # Untimed warm-up (allocator, page cache), which also says how long a run takes.
        warm_s = interleaved(spec, spill_root, disk_root, device, {"warm-up": 0})["warm-up"]["seconds"]
        short_s = 3 * warm_s / 5  # three copies take turns: each takes about three times as long to finish
        minutes = {"none": 0, "default": DEFAULT_CHECKPOINT_MINUTES, "short": short_s / 60}
        best: dict[str, dict[str, float]] = {}
        for round_ in range(args.rounds):
            runs = interleaved(spec, spill_root, disk_root, device, minutes)
            for key, run in runs.items():
                if key not in best or run["seconds"] < best[key]["seconds"]:
                    best[key] = run
            print(f"round {round_}: " + ", ".join(f"{k} {tokens / r['seconds']:.0f} tokens/s ({r['checkpoints']} "
                                                  f"checkpoints)" for k, r in runs.items()), file=sys.stderr)
    finally:
        shutil.rmtree(spill_root, ignore_errors=True)
        shutil.rmtree(disk_root, ignore_errors=True)
    speed = {key: tokens / run["seconds"] for key, run in best.items()}
    ratio = speed["default"] / speed["none"]
    short = best["short"]
    snapshot_s = min(run["snapshot_s"] for run in best.values())
    write_s = min(run["write_s"] for run in best.values())
    default_s = DEFAULT_CHECKPOINT_MINUTES * 60
    print(json.dumps({
        "interval_s": default_s,
        "checkpoints": int(best["default"]["checkpoints"]),
        "ratio": ratio,
        "checkpoint_bytes": int(short["bytes"]),
        "device": str(device),
        # One checkpoint per default interval of a long run: the trial stops for the snapshot only; were
        # the background copy to take the device's time too, the second figure.
        "projected_ratio": default_s / (default_s + snapshot_s),
        "projected_ratio_copy_not_overlapped": default_s / (default_s + snapshot_s + write_s),
        "snapshot_s": snapshot_s,
        "write_s": write_s,
        "short": {"interval_s": short_s, "checkpoints": int(short["checkpoints"]),
                  "ratio": speed["short"] / speed["none"]},
        "tokens_per_s": speed,
        "target_met": ratio >= TARGET,
    }))


if __name__ == "__main__":
    main()
