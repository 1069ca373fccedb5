"""What spilling costs: the same model and batches trained resident (plain PyTorch) and by Hydra's engine.

Resident: the transformers causal LM (``GPT2LMHeadModel``, ``LlamaForCausalLM``) + ``torch.optim.AdamW`` +
``clip_grad_norm_``, everything in memory.
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

``--model llama``: a Llama-style model of SmolLM2-135M's shape (30 layers, width 576, 9 heads with 3 key/value
heads, MLP 1536, tied head) with its real 49,152-token vocabulary, 8 x 256 = 2,048 tokens per step in 2
micro-batches, as the GPT-2 default (the tokens of a micro-batch set how much compute hides each byte of
spill traffic; benchmarks/RESULTS.md has runs at 1,024 tokens per step too), 3 timed steps, 2 rounds
(``--quick``: 8 layers, 8 x 64 tokens). Its tied embedding alone is a fifth of the state, so when a quarter
of the state cannot hold it next to its prefetch reserve the budget grows by twentieths of the state until the
engine's planner fits it (``budget_bytes`` says which). Then, unless ``--chunked-head``, the budget grows to the
smallest at which the planner keeps the head's logits whole: this benchmark measures what spilling costs, and a
head whose loss runs in token chunks (the planner's choice when the whole logits do not fit) recomputes its
logits, a memory-for-compute trade of its own that ``benchmarks/chunked_head.py`` measures. ``--model
llama-1b`` (for a GPU): Llama-3.2-1B's shape (16 layers, width 2,048, 32 heads with 8 key/value heads, MLP
8,192, 128,256-token vocabulary, tied), 16k tokens per step on CUDA; ``--bf16`` computes in bf16 with fp32
master weights in both runs (CUDA only).

``--threads`` lists the torch CPU thread counts to measure with, each a whole run of its own: by default
one thread and then every core this process may use (``all``); on CUDA only ``all``. One thread shows the
engine's own costs without contention for cores; all cores is how a worker with a whole machine runs, where
the engine's file I/O and the prefetch thread compete with torch's threads for the same cores.

The last line is one JSON object: ``{"chunked_head", "model", "bf16", "shards", "state_bytes", "budget_bytes", "device",
"runs": [{"threads", "resident_tokens_per_s", "spilled_tokens_per_s", "ratio", "ratio_no_double_buffer",
"target_met"}, ...]}``; ratios are spilled over resident throughput in the same run. Target: ratio >= 0.9
on CPU, >= 0.8 on GPU at 16k tokens per step.
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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.data import TokenBlocks
from worker.engine.families import architecture_from_spec
from worker.engine.layers import model_config
from worker.engine.train import train_trial

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.budgets import fitting_spec, whole_head_spec

FULL = {"layers": 12, "width": 768, "heads": 12, "vocab": 8192, "seq_len": 512, "batch": 4, "micro_batches": 2,
        "steps": 4, "rounds": 3}
QUICK = {"layers": 12, "width": 256, "heads": 4, "vocab": 1024, "seq_len": 64, "batch": 8, "micro_batches": 4,
         "steps": 4, "rounds": 2}
# On a GPU the target is stated at 16k tokens per step: 32 x 512, still in micro-batches of 1,024 tokens.
CUDA_FULL = {"batch": 32, "micro_batches": 16}
# SmolLM2-135M's shape and vocabulary; Llama-3.2-1B's for a GPU.
LLAMA = {"family": "llama", "layers": 30, "width": 576, "heads": 9, "kv_heads": 3, "inner": 1536, "vocab": 49152,
         "seq_len": 256, "batch": 8, "micro_batches": 2, "steps": 3, "rounds": 2}
LLAMA_QUICK = LLAMA | {"layers": 8, "seq_len": 64, "rounds": 1}
LLAMA_1B = {"family": "llama", "layers": 16, "width": 2048, "heads": 32, "kv_heads": 8, "inner": 8192,
            "vocab": 128256, "seq_len": 512, "batch": 4, "micro_batches": 2, "steps": 4, "rounds": 2}
SHAPES = {"gpt2": (FULL, QUICK), "llama": (LLAMA, LLAMA_QUICK), "llama-1b": (LLAMA_1B, LLAMA_1B)}
TARGET_CPU, TARGET_GPU = 0.9, 0.8  # spilled / resident throughput


def resident_trainer(spec: TrialSpec, device: torch.device) -> Callable[[int], None]:
    """`spec`'s model trained in plain PyTorch, everything resident: the transformers causal LM of the engine's
    config, AdamW, the step's micro-batches accumulated, the gradient clipped; returns the function that trains
    step n (on the batch the engine trains at step n)."""
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(model_config(spec.model)).to(device).train()
    opt = spec.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    data = TokenBlocks(spec.data, vocab_size=spec.model.vocab_size)

    def step(n: int) -> None:
        batch = data.train_batch(seed=spec.seed, step=n, batch_size=spec.batch_size).to(device)
        for micro_batch in batch.chunk(spec.micro_batches):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
                loss = model(micro_batch, labels=micro_batch).loss
            (loss / spec.micro_batches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
        optimizer.step()
        optimizer.zero_grad()

    return step


def resident_tokens_per_s(spec: TrialSpec, device: torch.device) -> float:
    """Plain PyTorch training throughput: tokens per step over the median step time, step 0 untimed."""
    step = resident_trainer(spec, device)
    seconds = []
    for n in range(spec.steps):
        _sync(device)
        start = time.perf_counter()
        step(n)
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
    parser.add_argument("--model", choices=sorted(SHAPES), default="gpt2",
                        help="gpt2 (default), llama (SmolLM2-135M's shape) or llama-1b (for a GPU)")
    parser.add_argument("--bf16", action="store_true", help="bf16 compute with fp32 master weights (CUDA only)")
    parser.add_argument("--steps", type=int, help="timed steps (default 4); one more untimed warm-up step runs")
    parser.add_argument("--batch", type=int, help="sequences per step (default 4; quick 8)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default 512; quick 64)")
    parser.add_argument("--micro-batches", type=int, help="micro-batches per step (default 2; quick 4)")
    parser.add_argument("--budget-fraction", type=float, default=0.25, help="budget as a share of the state")
    parser.add_argument("--spill-dir", type=Path, default=Path("/dev/shm"), help="where the spill store lives")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--chunked-head", action="store_true",
                        help="keep the budget where the planner computes the head's loss in token chunks instead "
                        "of raising it until the head fits whole")
    parser.add_argument("--rounds", type=int, help="interleaved measurement rounds, best kept (default 3; quick 2)")
    parser.add_argument("--threads", help="comma-separated torch CPU thread counts, each measured in a run of "
                        "its own; 'all' is every core this process may use (default 1,all; on CUDA all)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.bf16 and device.type != "cuda":
        parser.error("--bf16 needs a CUDA device")
    full, quick = SHAPES[args.model]
    shape = dict(quick if args.quick else full | (CUDA_FULL if device.type == "cuda" else {}))
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
        model = ModelSpec(family=shape.get("family", "gpt2"), n_layer=shape["layers"], n_embd=shape["width"],
                          n_head=shape["heads"], n_kv_head=shape.get("kv_heads"), n_inner=shape.get("inner"),
                          vocab_size=shape["vocab"], n_positions=shape["seq_len"], dropout=0.1)
        state_bytes = architecture_from_spec(model).n_params * 4 * 4  # fp32 params, grads, two AdamW moments
        budget = int(state_bytes * args.budget_fraction)
        spec = TrialSpec(
            model=model, data=DataSpec(tokens_path=str(workdir / "tokens.npy"), seq_len=shape["seq_len"]),
            optimizer=OptimizerSpec(kind="adamw", lr=1e-4, clip_norm=1.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=shape["batch"], micro_batches=shape["micro_batches"], steps=shape["steps"] + 1, eval_every=0,
            budget_bytes=budget, seed=0, bf16=args.bf16,
        )
        spec = fitting_spec(spec, workdir, device, step_bytes=state_bytes // 20)
        if not args.chunked_head:
            spec = whole_head_spec(spec, device)
        budget = spec.budget_bytes
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
        "chunked_head": args.chunked_head,
        "model": args.model,
        "bf16": args.bf16,
        "shards": shards,
        "state_bytes": state_bytes,
        "budget_bytes": budget,
        "device": str(device),
        "runs": runs,
    }))


if __name__ == "__main__":
    main()
