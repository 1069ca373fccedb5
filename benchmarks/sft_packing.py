"""What packing buys on instruction data: the same trials trained on one example per row and on packed rows.

The examples are chat-shaped (a prompt, then an answer the loss covers) with lengths spread log-uniformly from
``--min-len`` to the sequence length, as instruction sets are: most short, a few long. Both runs are the
engine's trial (sharded into ``--shards`` shards, spilled to a temporary directory under ``--spill-dir``) with
the same model, rows per step and steps; only ``packing`` differs. Throughput is example tokens (not padding)
per second of training, best of ``--rounds`` interleaved rounds, each run's first step a warm-up not timed.
Packing efficiency is the share of a step's token slots that hold example tokens, over the steps timed.

Defaults: a Llama-style model of 6 layers, width 256, 4 heads (2 key/value heads), a 4,096-token vocabulary,
rows of 256 tokens, 8 rows per step in 2 micro-batches, 6 timed steps, lengths from 16. ``--quick``: 4 layers,
width 128, rows of 128, 4 timed steps.

The last line is one JSON object: ``{"model", "seq_len", "rows_per_step", "examples", "mean_length",
"unpacked_tokens_per_s", "packed_tokens_per_s", "ratio", "unpacked_efficiency", "packed_efficiency",
"target_met"}``; ``ratio`` is packed over unpacked throughput in the same run. Target: ratio >= 2 on such
short-example data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import LAST_ANSWER, PROMPT
from worker.engine.examples import ExampleRows, ExampleSet


def example_set(n: int, *, vocab: int, min_len: int, max_len: int, seed: int) -> ExampleSet:
    """`n` chat-shaped examples of log-uniform lengths in [min_len, max_len]: a prompt, then the answer."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(min_len), np.log(max_len + 1), n)).astype(int).clip(min_len, max_len)
    examples = []
    for length in lengths.tolist():
        marks = np.full(length, LAST_ANSWER, dtype=np.uint8)
        marks[: max(1, length // 3)] = PROMPT
        examples.append((rng.integers(1, vocab, length).astype(np.int32), marks))
    return ExampleSet.from_examples(examples)


def run(spec: TrialSpec, root: Path, *, shards: int, steps: int) -> tuple[float, float]:
    """(example tokens per second over the timed steps, packing efficiency of those steps) of one trial."""
    blocks = spec.model.n_layer + 2
    cuts = sorted({round(i * blocks / shards) for i in range(shards)})
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=torch.device("cpu"), cuts=cuts)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=torch.device("cpu"))
    rows = ExampleRows.of(spec.data, vocab_size=spec.model.vocab_size)
    started = None
    try:
        while (unit := session.next_unit()) is not None:
            if unit.step == 1 and started is None:  # step 0 warms up
                started = time.perf_counter()
            if unit.index + 1 < len(session.timetable):
                session.prefetch(session.timetable[unit.index + 1])
            session.run_unit()
        elapsed = time.perf_counter() - (started or 0.0)
    finally:
        session.close()
    timed = [rows.train_rows(seed=spec.seed, step=s, batch_size=spec.batch_size) for s in range(1, steps + 1)]
    tokens = sum(int(rows.examples.lengths[k]) for step in timed for row in step for k in row)
    return tokens / elapsed, rows.efficiency([row for step in timed for row in step])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--examples", type=int, default=2_000)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--spill-dir", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers, width, seq_len, steps = (4, 128, 128, 4) if args.quick else (6, 256, 256, 6)
    vocab, rows_per_step = 4_096, 8
    with tempfile.TemporaryDirectory(dir=args.spill_dir, prefix="hydra-sft-packing-") as scratch:
        root = Path(scratch)
        examples = example_set(args.examples, vocab=vocab, min_len=args.min_len, max_len=seq_len, seed=0)
        examples.save(root / "examples")
        results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            for packing in (False, True):
                spec = TrialSpec(
                    model=ModelSpec(family="llama", n_layer=layers, n_embd=width, n_head=4, n_kv_head=2,
                                    vocab_size=vocab, n_positions=seq_len, dropout=0.0),
                    data=DataSpec(examples_dir=str(root / "examples"), train_examples=args.examples - 100,
                                  seq_len=seq_len, packing=packing, loss_on="assistant"),
                    optimizer=OptimizerSpec(kind="adamw", lr=1e-3), schedule=ScheduleSpec(decay="constant"),
                    batch_size=rows_per_step, micro_batches=2, steps=steps + 1, seed=1, budget_bytes=1 << 34,
                )
                trial_root = root / f"run-{round_}-{packing}"
                results[packing].append(run(spec, trial_root, shards=args.shards, steps=steps))
                shutil.rmtree(trial_root)
        unpacked = max(results[False])
        packed = max(results[True])
        ratio = packed[0] / unpacked[0]
        print(json.dumps({
            "model": f"llama {layers}x{width}, vocab {vocab}", "seq_len": seq_len, "rows_per_step": rows_per_step,
            "examples": args.examples, "mean_length": round(float(examples.lengths.mean()), 1),
            "unpacked_tokens_per_s": round(unpacked[0], 1), "packed_tokens_per_s": round(packed[0], 1),
            "ratio": round(ratio, 3), "unpacked_efficiency": round(unpacked[1], 3),
            "packed_efficiency": round(packed[1], 3), "target_met": ratio >= 2.0,
        }))


if __name__ == "__main__":
    main()
