"""Train a model whose training state is many times the device budget, spilled to the disk tier.

The full training state (fp32 parameters, gradients, AdamW moments) lives in a spill directory on local
disk (``--spill-dir``, a temporary directory under /tmp by default); the engine keeps at most one shard
unit plus the prefetched next shard on the device. Activations are always recomputed here (kept
activations would live in host memory, which on CPU is the memory being measured).

Three figures, each named for what it is:
- ``peak_device_bytes``: the most bytes of tensors the engine held on the device at once. On CUDA,
  ``torch.cuda.max_memory_allocated``. On CPU, the running total of the CPU allocator's allocations and
  frees as PyTorch's profiler records them (``profile_memory``). The profiler sees the calling thread's
  allocations only, and its records take memory, so on CPU the trial is trained a second time for this
  figure, profiled and without the background prefetch (whose reads a CPU device cannot overlap with
  compute anyway); both runs must give the same losses.
- ``peak_rss_growth_bytes``: the process's peak resident set (``ru_maxrss``) over its resident set before
  the trial, in the first run (with prefetch, as a worker runs it): everything the process touched,
  allocator slack and Python objects included.

The benchmark fails (exit status 1) when either peak exceeds the budget.
- ``page_cache_growth_bytes``: how much the kernel's page cache grew during the run (``Cached`` in
  /proc/meminfo, machine-wide): spill files the kernel kept in memory, which is not the process's memory
  but is memory the machine spent.

The data is a synthetic Markov chain over 64 of the vocabulary's tokens (each with 4 possible successors),
so that the loss can fall within a few steps. Before the baseline RSS is read, a one-layer trial runs
through every code path (lazy imports, kernels); glibc's malloc is told to serve allocations of 1 MiB and
more with mmap so that freed buffers leave the resident set (fragmentation is not the engine's memory).

Defaults: 48 layers, width 768, 12 heads (340M parameters, 5.4 GB of state), vocabulary 4096, 4 x 128
tokens per step in 2 micro-batches, 6 steps, budget = state / 20. ``--quick``: 20 layers, width 512,
vocabulary 1024, 2 x 64 tokens per step, 3 steps, budget = state / 12 (under a minute on 2 CPU cores).

The last line is one JSON object: ``{"state_bytes", "budget_bytes", "peak_device_bytes",
"peak_device_within_budget", "peak_rss_growth_bytes", "peak_rss_within_budget", "page_cache_growth_bytes",
"state_to_peak", "loss_first", "loss_last", "device", "target_met"}``; ``state_to_peak`` is the state over
``peak_device_bytes``. Target: both peaks <= budget_bytes, state_to_peak >= 10 and loss_last < loss_first.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

# As a CPU device worker runs (`worker.devices.Device.worker_env`): MKL keeps no pool of freed buffers, which
# would hold memory outside the budget. Read when MKL loads, so before torch is imported.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

import torch

from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.train import train_trial

FULL = {"layers": 48, "width": 768, "heads": 12, "vocab": 4096, "seq_len": 128, "batch": 4, "micro_batches": 2,
        "steps": 6, "budget_divisor": 20.0}
QUICK = {"layers": 20, "width": 512, "heads": 8, "vocab": 1024, "seq_len": 64, "batch": 2, "micro_batches": 1,
         "steps": 3, "budget_divisor": 12.0}


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def rss_bytes() -> int:
    """The current resident set of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def page_cache_bytes() -> int:
    """The kernel's page cache, machine-wide (``Cached`` in /proc/meminfo)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_live_bytes(profiler: torch.profiler.profile) -> int:
    """The highest running total of the CPU allocator's allocations minus frees that `profiler` recorded
    (frees of memory allocated before it started are not reported, so the total starts at zero)."""
    events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def markov_tokens(vocab: int, count: int, seed: int = 0) -> np.ndarray:
    """A stream over 64 of ``vocab``'s tokens, each followed by one of 4 fixed successors (learnable)."""
    rng = np.random.default_rng(seed)
    alphabet = rng.choice(vocab, size=64, replace=False)
    successors = rng.integers(0, 64, size=(64, 4))
    choices = rng.integers(0, 4, size=count)
    states = np.empty(count, dtype=np.int64)
    states[0] = 0
    for i in range(1, count):
        states[i] = successors[states[i - 1], choices[i]]
    return alphabet[states].astype(np.int32)


def warm_up(workdir: Path, device: torch.device) -> None:
    """Run a one-layer trial so that lazy imports and first-use allocations precede the baseline."""
    np.save(workdir / "warm.npy", markov_tokens(64, 16 * 64))
    spec = TrialSpec(model=ModelSpec(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16),
                     data=DataSpec(tokens_path=str(workdir / "warm.npy"), seq_len=16), batch_size=2, steps=2,
                     eval_every=1, eval_batches=1, activations="recompute")
    train_trial(spec=spec, spill_dir=workdir, trial_id="warm-up", device=device, cuts=[0, 1, 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller model, under a minute on 2 CPU cores")
    parser.add_argument("--steps", type=int, help="optimizer steps (default 6; quick 3)")
    parser.add_argument("--budget-divisor", type=float, help="budget = state / this (default 20; quick 12)")
    parser.add_argument("--spill-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="parent of the spill directory: a local disk path (the disk tier)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    args = parser.parse_args()
    shape = dict(QUICK if args.quick else FULL)
    for key in ("steps", "budget_divisor"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)

    workdir = Path(tempfile.mkdtemp(prefix="hydra-memory-bound-", dir=args.spill_dir))
    try:
        np.save(workdir / "tokens.npy", markov_tokens(shape["vocab"], shape["seq_len"] * 512))
        model = ModelSpec(n_layer=shape["layers"], n_embd=shape["width"], n_head=shape["heads"],
                          vocab_size=shape["vocab"], n_positions=shape["seq_len"], dropout=0.0)
        # Parameters of GPT-2 from its shapes (tied head): embeddings, 12 C^2 + 13 C per block, final norm.
        width = shape["width"]
        n_params = ((shape["vocab"] + shape["seq_len"]) * width + shape["layers"] * (12 * width * width + 13 * width)
                    + 2 * width)
        state_bytes = n_params * 4 * 4  # fp32 parameters, gradients and two AdamW moments
        budget = int(state_bytes / shape["budget_divisor"])
        spec = TrialSpec(
            model=model, data=DataSpec(tokens_path=str(workdir / "tokens.npy"), seq_len=shape["seq_len"]),
            optimizer=OptimizerSpec(kind="adamw", lr=3e-4, weight_decay=0.0, clip_norm=1.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=shape["batch"], micro_batches=shape["micro_batches"], steps=shape["steps"], eval_every=0,
            budget_bytes=budget, seed=0, activations="recompute",
        )
        warm_up(workdir, device)
        baseline = rss_bytes()
        cached_before = page_cache_bytes()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        results = train_trial(spec=spec, spill_dir=workdir, trial_id="memory-bound", device=device)
        peak_rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
        page_cache_growth = page_cache_bytes() - cached_before
        if device.type == "cuda":
            peak_device = torch.cuda.max_memory_allocated(device)
        else:  # the profiler's records take memory of their own: a second run, after the RSS was read
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        profile_memory=True) as profiler:
                again = train_trial(spec=spec, spill_dir=workdir, trial_id="memory-bound-profiled",
                                    device=device, double_buffer=False)
            peak_device = peak_live_bytes(profiler)
            if [r.loss for r in again] != [r.loss for r in results]:
                sys.exit("the profiled run's losses differ from the first run's")
        losses = [r.loss for r in results if r.loss is not None]
        print(f"losses: {[round(loss, 4) for loss in losses]}", file=sys.stderr)
        print(f"shards: {max(r.unit.shard for r in results) + 1}, units: {len(results)}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({
        "state_bytes": state_bytes,
        "budget_bytes": budget,
        "peak_device_bytes": peak_device,
        "peak_device_within_budget": peak_device <= budget,
        "peak_rss_growth_bytes": peak_rss_growth,
        "peak_rss_within_budget": peak_rss_growth <= budget,
        "page_cache_growth_bytes": page_cache_growth,
        "state_to_peak": state_bytes / peak_device,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "device": str(device),
        "target_met": (peak_device <= budget and peak_rss_growth <= budget and state_bytes / peak_device >= 10
                       and losses[-1] < losses[0]),
    }))
    if peak_device > budget:
        sys.exit(f"the engine held {peak_device} bytes on the device, over its budget of {budget}")
    if peak_rss_growth > budget:
        sys.exit(f"the process's resident set grew by {peak_rss_growth} bytes, over the budget of {budget}")


if __name__ == "__main__":
    main()
