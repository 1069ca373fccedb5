"""Train one trial in one process: ``train_trial`` for code, ``python -m worker.engine.train`` for people.

The command line prints a progress bar on stderr and a JSON summary as its last stdout line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.create import trial_create, trial_exists
from worker.engine.data import tokenize_corpus
from worker.engine.errors import EngineError, SpecError
from worker.engine.families import FAMILIES
from worker.engine.session import TrialSession, UnitResult


def train_trial(*, spec: TrialSpec, spill_dir: Path, trial_id: str, device: torch.device,
                cuts: Sequence[int] | None = None, double_buffer: bool = True,
                progress: bool = False) -> list[UnitResult]:
    """Create the trial (or resume it if its spill directory exists) and run its remaining units.

    With ``double_buffer`` the next unit's shard is read in the background while a unit computes.
    Returns the results of the units run by this call. Raises ``SpecError`` if the existing trial was
    created from a different spec.
    """
    if not trial_exists(spill_dir=spill_dir, trial_id=trial_id):
        trial_create(spec=spec, spill_dir=spill_dir, trial_id=trial_id, device=device, cuts=cuts)
    session = TrialSession.open(spill_dir=spill_dir, trial_id=trial_id, device=device)
    if session.spec != spec:
        raise SpecError(f"trial {trial_id!r} in {spill_dir} was created with another spec; resume it with the "
                        "same settings or pick another trial id")
    results = []
    with contextlib.closing(session), tqdm(total=session.remaining_units(), disable=not progress, unit="unit") as bar:
        while (unit := session.next_unit()) is not None:
            if double_buffer and unit.index + 1 < len(session.timetable):
                session.prefetch(session.timetable[unit.index + 1])
            result = session.run_unit()
            results.append(result)
            bar.update()
            if result.loss is not None:
                bar.set_postfix(step=result.unit.step, loss=f"{result.loss:.4f}")
    return results


def summarize(results: Sequence[UnitResult], session: TrialSession, seconds: float) -> dict[str, Any]:
    """The JSON-able summary the command line prints."""
    steps = [r for r in results if r.loss is not None]
    evals = [r for r in results if r.eval_loss is not None]
    tokens = len(steps) * session.spec.batch_size * session.spec.data.seq_len
    return {
        "trial_id": session.trial_id,
        "steps": len(steps),
        "loss_first": steps[0].loss if steps else None,
        "loss_last": steps[-1].loss if steps else None,
        "eval_loss": evals[-1].eval_loss if evals else None,
        "eval_ppl": evals[-1].eval_ppl if evals else None,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "seconds": seconds,
        "units": len(results),
        "stopped_early": any(r.stopped_early for r in results),
        "shards": len(session.plan.shards),
        "state_bytes": session.plan.state_bytes,
        "budget_bytes": session.plan.budget_bytes,
        "planned_peak_bytes": session.plan.peak_bytes,
        "bytes_read": sum(r.bytes_read for r in results),
        "bytes_written": sum(r.bytes_written for r in results),
        "device": str(session.device),
    }


def parse_bytes(text: str) -> int:
    """``"512M"`` -> 536870912; plain integers are bytes; K, M, G, T are powers of 1024."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker.engine.train",
        description="Train one causal-LM trial (GPT-2, Llama, Mistral, Qwen2 or Qwen3) with Hydra's sharded, "
                    "spilled engine; prints a JSON summary last.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data (one of --corpus or --tokens)")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="UTF-8 text file; tokenized with a byte-level BPE trained on it")
    source.add_argument("--tokens", type=Path, help="1-D .npy of token ids (already tokenized)")
    data.add_argument("--tokenizer-dir", type=Path,
                      help="use this directory's tokenizer.json instead of training one (default with "
                           "--pretrained-dir: that directory's tokenizer, when it has one)")
    data.add_argument("--seq-len", type=int, default=128, help="tokens per packed block (sequence)")
    data.add_argument("--val-fraction", type=float, default=0.1, help="share of blocks held out for evaluation")
    model = parser.add_argument_group("model (a family and its sizes, or --pretrained-dir)")
    model.add_argument("--pretrained-dir", type=Path,
                       help="local save_pretrained directory (safetensors) of any supported family; its config "
                            "wins over the size flags")
    model.add_argument("--family", choices=FAMILIES, default="gpt2", help="model family built from the sizes")
    model.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    model.add_argument("--n-embd", type=int, default=128, help="hidden width")
    model.add_argument("--n-head", type=int, default=4, help="attention heads")
    model.add_argument("--n-kv-head", type=int,
                       help="key/value heads of grouped-query attention, dividing --n-head (default: --n-head)")
    model.add_argument("--n-inner", type=int, help="MLP width (default: the family's, e.g. 4 x width for GPT-2)")
    model.add_argument("--untied", action="store_true", help="an LM head of its own instead of the tied embedding")
    model.add_argument("--vocab-size", type=int, default=512,
                       help="vocabulary size (BPE training target; with --tokens it must exceed the largest id)")
    model.add_argument("--n-positions", type=int, help="context length (default: --seq-len)")
    model.add_argument("--dropout", type=float, default=0.1,
                       help="GPT-2's embedding, attention and residual dropout; the other families' attention dropout")
    optim = parser.add_argument_group("optimization")
    optim.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    optim.add_argument("--micro-batches", type=int, default=1, help="gradient-accumulation micro-batches per step")
    optim.add_argument("--steps", type=int, default=100, help="optimizer steps")
    optim.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="torch.optim optimizer")
    optim.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    optim.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999), help="AdamW betas")
    optim.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    optim.add_argument("--weight-decay", type=float, default=0.01, help="weight decay (all parameters)")
    optim.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    optim.add_argument("--clip-norm", type=float, default=1.0, help="max global gradient norm; 0 disables clipping")
    optim.add_argument("--warmup-steps", type=int, default=10, help="linear warm-up steps from lr 0")
    optim.add_argument("--decay", choices=["constant", "linear", "cosine"], default="cosine",
                       help="learning-rate decay after warm-up")
    optim.add_argument("--eval-every", type=int, default=50, help="evaluate every N steps and at the end; 0: never")
    optim.add_argument("--eval-batches", type=int, default=4, help="validation micro-batches per evaluation")
    optim.add_argument("--early-stop-patience", type=int,
                       help="stop after this many evaluations without a lower validation loss (default: never)")
    run = parser.add_argument_group("run")
    run.add_argument("--budget", type=parse_bytes, default=parse_bytes("1G"),
                     help="device memory budget, bytes or with K/M/G suffix")
    run.add_argument("--spill-dir", type=Path, default=Path("/dev/shm/hydra"),
                     help="spill store root: /dev/shm (host tier) or a local disk path (disk tier)")
    run.add_argument("--trial-id", default="cli", help="trial directory under --spill-dir; an existing one resumes")
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    run.add_argument("--seed", type=int, default=0, help="seed of init, data order and dropout")
    run.add_argument("--bf16", action="store_true", help="bf16 autocast with fp32 master weights (CUDA)")
    run.add_argument("--no-double-buffer", action="store_true", help="do not prefetch the next shard")
    run.add_argument("--activations", choices=["auto", "recompute"], default="auto",
                     help="auto: keep a shard's activations for its backward when measured cheaper than "
                          "recomputing them; recompute: always recompute")
    run.add_argument("--export", type=Path, help="write the trained model here (save_pretrained, safetensors)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def spec_from_args(args: argparse.Namespace) -> TrialSpec:
    vocab_size = args.vocab_size
    tokenizer_dir = args.tokenizer_dir
    if tokenizer_dir is None and args.pretrained_dir is not None and (args.pretrained_dir / "tokenizer.json").is_file():
        tokenizer_dir = args.pretrained_dir  # a pretrained model reads text with its own tokenizer
    if tokenizer_dir is not None and not (tokenizer_dir / "tokenizer.json").is_file():
        raise SpecError(f"--tokenizer-dir {tokenizer_dir} holds no tokenizer.json")
    if args.corpus is not None:
        data_dir = args.spill_dir / f"{args.trial_id}.data"
        tokens, vocab_size = tokenize_corpus(args.corpus, data_dir, vocab_size=args.vocab_size,
                                             tokenizer_dir=tokenizer_dir)
        tokenizer_dir = tokenizer_dir or data_dir  # the BPE trained on the corpus, saved there
    else:
        tokens = args.tokens
    return TrialSpec(
        model=ModelSpec(family=args.family, n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                        n_kv_head=args.n_kv_head, n_inner=args.n_inner, vocab_size=vocab_size,
                        n_positions=args.n_positions or args.seq_len, dropout=args.dropout,
                        tie_word_embeddings=not args.untied,
                        pretrained_dir=str(args.pretrained_dir) if args.pretrained_dir else None),
        data=DataSpec(tokens_path=str(tokens), seq_len=args.seq_len, val_fraction=args.val_fraction,
                      tokenizer_dir=str(tokenizer_dir) if tokenizer_dir else None),
        optimizer=OptimizerSpec(kind=args.optimizer, lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                                weight_decay=args.weight_decay, momentum=args.momentum,
                                clip_norm=args.clip_norm or None),
        schedule=ScheduleSpec(warmup_steps=args.warmup_steps, decay=args.decay),
        batch_size=args.batch_size, micro_batches=args.micro_batches, steps=args.steps,
        eval_every=args.eval_every, eval_batches=args.eval_batches, seed=args.seed,
        budget_bytes=args.budget, bf16=args.bf16, activations=args.activations,
        early_stop_patience=args.early_stop_patience,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    start = time.perf_counter()
    try:
        spec = spec_from_args(args)
        results = train_trial(spec=spec, spill_dir=args.spill_dir, trial_id=args.trial_id, device=device,
                              double_buffer=not args.no_double_buffer, progress=not args.no_progress)
    except EngineError as error:
        parser.exit(2, f"error: {error}\n")
    seconds = time.perf_counter() - start
    session = TrialSession.open(spill_dir=args.spill_dir, trial_id=args.trial_id, device=device)
    if args.export is not None:
        session.export(args.export)
    summary = summarize(results, session, seconds)
    print(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}))


if __name__ == "__main__":
    main()
