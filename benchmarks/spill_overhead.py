"""What spilling costs: the same GPT-2 and batches trained resident (plain PyTorch) and by Hydra's engine.

Resident: ``GPT2LMHeadModel`` + ``torch.optim.AdamW`` + ``clip_grad_norm_``, everything in memory.
Spilled: the engine with a budget of ``--budget-fraction`` of the training state (parameters, gradients,
AdamW moments), shards spilled to ``--spill-dir`` (the host tier, /dev/shm, by default), with and without
the double buffer. The first step of each run is a warm-up and is not timed.

Defaults: GPT-2-small-shaped (12 layers, width 768, 12 heads) with an 8192-token vocabulary, 4 x 512 =
2048 tokens per step in 2 micro-batches (both runs accumulate gradients the same way), 4 timed steps,
budget 1/4 of the state. (The 50257-token vocabulary's tied embedding is 31% of GPT-2 small's state by
itself and cannot fit a quarter budget next to its prefetch reserve; a whole 2048-token micro-batch's
activations do not fit next to one block either.) ``--quick``: 12 layers, width 256, 1024 vocabulary,
8 x 64 = 512 tokens per step in 4 micro-batches, 4 timed steps (under a minute on 2 CPU cores). On CUDA
the full run takes 32 x 512 = 16,384 tokens per step in 16 micro-batches, where the GPU target is stated.
Throughput is tokens per step over the median step time, best of interleaved rounds (3; quick 2).

``--threads`` lists the torch CPU thread counts to measure with, each a whole run of its own: by default
one thread and then every core this process may use (``all``); on CUDA only ``all``. One thread shows the
engine's own costs without contention for cores; all cores is how a worker with a whole machine runs, where
the engine's file I/O and the prefetch thread compete with torch's threads for the same cores.

The last line is one JSON object: ``{"shards", "state_bytes", "budget_bytes", "device", "runs": [{"threads",
"resident_tokens_per_s", "spilled_tokens_per_s", "ratio", "ratio_no_double_buffer", "target_met"}, ...]}``; ratios are
spilled over resident throughput in the same run. Target: ratio >= 0.9 on CPU, >= 0.8 on GPU at 16k tokens
per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.data import TokenBlocks
from worker.engine.layers import gpt2_config
from worker.engine.train import train_trial

FULL = {"layers": 12, "width": 768, "heads": 12, "vocab": 8192, "seq_len": 512, "batch": 4, "micro_batches": 2,
        "steps": 4, "rounds": 3}
QUICK = {"layers": 12, "width": 256, "heads": 4, "vocab": 1024, "seq_len": 64, "batch": 8, "micro_batches": 4,
         "steps": 4, "rounds": 2}
# On a GPU the target is stated at 16k tokens per step: 32 x 512, still in micro-batches of 1,024 tokens.
CUDA_FULL = {"batch": 32, "micro_batches": 16}
TARGET_CPU, TARGET_GPU = 0.9, 0.8  # spilled / resident throughput


def resident_tokens_per_s(spec: TrialSpec, device: torch.device) -> float:
    """Plain PyTorch training throughput: tokens per step over the median step time, step 0 untimed."""
    torch.manual_seed(spec.seed)
    model = GPT2LMHeadModel(gpt2_config(spec.model)).to(device).train()
    opt = spec.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    data = TokenBlocks(spec.data, vocab_size=spec.model.vocab_size)
    seconds = []
    for step in range(spec.steps):
        _sync(device)
        start = time.perf_counter()
        batch = data.train_batch(seed=spec.seed, step=step, batch_size=spec.batch_size).to(device)
        for micro_batch in batch.chunk(spec.micro_batches):
            (model(micro_batch, labels=micro_batch).loss / spec.micro_batches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return spec.batch_size * spec.data.seq_len / statistics.median(seconds[1:])


def spilled_tokens_per_s(spec: TrialSpec, spill_dir: Path, device: torch.device, *,
                         double_buffer: bool) -> tuple[float, int]:
    """Engine throughput (median step time over the units of each step after the first, the optimizer
    step of step s being paid lazily in step s+1); also returns the shard count."""
    trial_id = f"spill-overhead-{double_buffer}"
    results = train_trial(spec=spec, spill_dir=spill_dir, trial_id=trial_id, device=device,
                          double_buffer=double_buffer)
    seconds = [0.0] * spec.steps
    for result in results:
        if result.unit.phase != "S":
            seconds[result.unit.step] += result.seconds
    shards = max(r.unit.shard for r in results) + 1
    shutil.rmtree(spill_dir / trial_id, ignore_errors=True)
    return spec.batch_size * spec.data.seq_len / statistics.median(seconds[1:]), shards


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small model, under a minute on 2 CPU cores")
    parser.add_argument("--steps", type=int, help="timed steps (default 4); one more untimed warm-up step runs")
    parser.add_argument("--batch", type=int, help="sequences per step (default 4; quick 8)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default 512; quick 64)")
    parser.add_argument("--micro-batches", type=int, help="micro-batches per step (default 2; quick 4)")
    parser.add_argument("--budget-fraction", type=float, default=0.25, help="budget as a share of the state")
    parser.add_argument("--spill-dir", type=Path, default=Path("/dev/shm"), help="where the spill store lives")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--rounds", type=int, help="interleaved measurement rounds, best kept (default 3; quick 2)")
    parser.add_argument("--threads", help="comma-separated torch CPU thread counts, each measured in a run of "
                        "its own; 'all' is every core this process may use (default 1,all; on CUDA all)")
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = dict(QUICK if args.quick else FULL | (CUDA_FULL if device.type == "cuda" else {}))
    for key in ("steps", "batch", "seq_len", "micro_batches", "rounds"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    cores = len(os.sched_getaffinity(0))
    try:
        thread_counts = [cores if t.strip() == "all" else int(t)
                         for t in (args.threads or ("all" if device.type == "cuda" else "1,all")).split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads!r}: give numbers or 'all', separated by commas")
    if any(t < 1 for t in thread_counts):
        parser.error("--threads: each count must be at least 1")
    thread_counts = list(dict.fromkeys(thread_counts))  # 1,all on a one-core machine is one run

    workdir = Path(tempfile.mkdtemp(prefix="hydra-bench-", dir=args.spill_dir))
    try:
        tokens = np.random.default_rng(0).integers(0, shape["vocab"], shape["seq_len"] * 256, dtype=np.int32)
        np.save(workdir / "tokens.npy", tokens)
        model = ModelSpec(n_layer=shape["layers"], n_embd=shape["width"], n_head=shape["heads"],
                          vocab_size=shape["vocab"], n_positions=shape["seq_len"], dropout=0.1)
        with torch.device("meta"):
            n_params = sum(p.numel() for p in GPT2LMHeadModel(gpt2_config(model)).parameters())
        state_bytes = n_params * 4 * 4  # fp32 parameters, gradients and two AdamW moments
        budget = int(state_bytes * args.budget_fraction)
        spec = TrialSpec(
            model=model, data=DataSpec(tokens_path=str(workdir / "tokens.npy"), seq_len=shape["seq_len"]),
            optimizer=OptimizerSpec(kind="adamw", lr=1e-4, clip_norm=1.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=shape["batch"], micro_batches=shape["micro_batches"], steps=shape["steps"] + 1, eval_every=0,
            budget_bytes=budget, seed=0,
        )
        runs = []
        for threads in thread_counts:
            torch.set_num_threads(threads)
            # Best of interleaved rounds: other load on a shared machine only ever slows a run down.
            resident = spilled = spilled_plain = 0.0
            for round_ in range(shape["rounds"]):
                resident = max(resident, resident_tokens_per_s(spec, device))
                tokens_per_s, shards = spilled_tokens_per_s(spec, workdir, device, double_buffer=True)
                spilled = max(spilled, tokens_per_s)
                spilled_plain = max(spilled_plain,
                                    spilled_tokens_per_s(spec, workdir, device, double_buffer=False)[0])
                print(f"{threads} thread(s), round {round_}: resident {resident:.1f}, spilled {spilled:.1f} "
                      f"({shards} shards), without double buffer {spilled_plain:.1f} tokens/s (best so far)",
                      file=sys.stderr)
            runs.append({"threads": threads, "resident_tokens_per_s": resident, "spilled_tokens_per_s": spilled,
                         "ratio": spilled / resident, "ratio_no_double_buffer": spilled_plain / resident,
                         "target_met": spilled / resident >= (TARGET_GPU if device.type == "cuda" else TARGET_CPU)})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({
        "shards": shards,
        "state_bytes": state_bytes,
        "budget_bytes": budget,
        "device": str(device),
        "runs": runs,
    }))


if __name__ == "__main__":
    main()
