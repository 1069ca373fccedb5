"""What ASHA saves: the same 9-trial random search over learning rates, run to completion and with ASHA.

Nine GPT-2 trials (4 blocks of width 128, several shards each) draw their learning rate log-uniformly from
1e-4 to 1e-2 (the same nine in both runs) and train `--steps` steps on tokens that mostly follow one another
by a fixed rule, evaluating every `--steps` / 9 steps. Both runs go through real CPU device workers
(`--devices`, default 2, real Celery processes under a throw-away host namespace of ``REDIS_URL``): first
every trial to its last step, then the same trials with asynchronous successive halving (Optuna's
``SuccessiveHalvingPruner``: first rung at `--steps` / 9, reduction factor 3), where a pruned trial ends at
its rung and its device goes to the others at once.

Device time is the sum of the units' and plannings' spans on all devices (what the trials cost the devices,
whichever ran them). ``same_best``: the trial with the lowest final validation loss of the full run is the
one with the lowest final validation loss among those ASHA let finish.

The last line is one JSON object: ``{"trials", "device_s_full", "device_s_asha", "ratio", "same_best",
"device"}``. Target: ``ratio`` (ASHA's device time over the full run's) at most 0.5, with ``same_best``.

``--wavefronts`` measures something else on the same sweep: the trials cut each step into 4 micro-batches, and
the ASHA run goes twice, once with each trial on one device at most (``max_devices`` 1) and once letting the
scheduler run a trial's micro-batches on both devices when no other trial waits (the default), which is when
ASHA's few survivors train alone. ASHA decides asynchronously, on the trials that reached a rung so far, so
how many trials it lets finish depends on the order in which they reach their rungs, and one survivor more or
less moves a run's makespan by more than wavefronts do: ``--rounds`` (default 3) pairs of runs alternate, and
the ratio is of the medians. Its JSON: ``{"trials", "rounds", "makespan_s_narrow", "makespan_s_wavefronts"
(medians), "makespan_ratio", "survivors" {"narrow", "wavefronts"} (the trials each run let finish),
"same_best", "device", "target_met"}``; target: ``makespan_ratio`` at most 0.8, with the same best trial in
every run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np

from benchmarks.local_workers import LocalWorkers
from worker import config
from worker.contract import EngineJob, PrunerSpec, PruningJob
from worker.devices import Device
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.scheduling import pruning

TRIALS = 9
TARGET_RATIO = 0.5
TARGET_MAKESPAN_RATIO = 0.8


def markov_tokens(path: Path, n: int = 65_536, vocab: int = 256) -> Path:
    """Tokens that mostly follow one another by a fixed rule, the rest random: there is something to learn,
    and a larger learning rate learns it faster in a short budget."""
    rng = np.random.default_rng(0)
    ids = np.empty(n, dtype=np.int32)
    ids[0] = 0
    noise = rng.random(n) >= 0.9
    random_ids = rng.integers(0, vocab, n)
    for i in range(1, n):
        ids[i] = random_ids[i] if noise[i] else (ids[i - 1] * 5 + 3) % vocab
    np.save(path, ids)
    return path


def trials(tokens: Path, steps: int, micro_batches: int = 1) -> dict[str, TrialSpec]:
    rng = random.Random(3)
    rates = [10 ** rng.uniform(math.log10(1e-4), math.log10(1e-2)) for _ in range(TRIALS)]
    return {
        f"t{n}": TrialSpec(
            model=ModelSpec(n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=64, dropout=0.0),
            data=DataSpec(tokens_path=str(tokens), seq_len=64), optimizer=OptimizerSpec(lr=lr),
            schedule=ScheduleSpec(warmup_steps=0, decay="cosine"), batch_size=8, micro_batches=micro_batches,
            steps=steps,
            eval_every=max(1, steps // 9), eval_batches=2, seed=0, budget_bytes=16 << 20)
        for n, lr in enumerate(rates, start=1)
    }


def run(specs: dict[str, TrialSpec], devices: list[Device], root: Path, pruner: PrunerSpec | None,
        max_devices: int | None = None) -> dict:
    """Train `specs` on real device workers (each on `max_devices` at most at once); each trial's end state,
    final evaluation, device seconds and the wall time from the first submission to the last trial's end."""
    study = f"asha-bench-{uuid.uuid4().hex[:8]}"
    with LocalWorkers(devices=devices, redis_url=config.current().redis_url, root=root) as workers:
        try:
            start = workers.clock()
            for n, (trial_id, spec) in enumerate(specs.items(), start=1):
                job = EngineJob(trial=spec, max_devices=max_devices, pruning=None if pruner is None else PruningJob(
                    study=study, trial_number=n, pruner=pruner))
                workers.queue.submit(trial_id=trial_id, job=job, export_dir=str(root / "exports" / trial_id))
            wall = workers.wait_until_ended(list(specs), timeout_s=3600) - start
            spans = workers.entries("spans")
            evals = workers.entries("evals")
            states = {trial_id: workers.queue.trial(trial_id).state for trial_id in specs}
        finally:
            pruning.forget(workers.client, study)
    final = {}
    for trial_id in specs:
        mine = sorted((e for e in evals if e["trial"] == trial_id), key=lambda e: int(e["step"]))
        final[trial_id] = float(mine[-1]["loss"]) if mine else float("inf")
    device_s = sum(float(s["end"]) - float(s["start"]) for s in spans)
    return {"states": states, "final": final, "device_s": device_s, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU device workers (default 2)")
    parser.add_argument("--steps", type=int, default=81, help="steps per trial (default 81: rungs at 9 and 27)")
    parser.add_argument("--quick", action="store_true", help="27 steps per trial (rungs at 3 and 9)")
    parser.add_argument("--wavefronts", action="store_true",
                        help="the ASHA sweep with 4 micro-batches a step, on one device per trial and as wavefronts")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --wavefronts: pairs of runs, one device per trial and as wavefronts (default 3)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    steps = 27 if args.quick else args.steps
    devices = [Device("cpu", i, 1) for i in range(args.devices)]
    asha = PrunerSpec(kind="asha", min_resource=max(1, steps // 9), reduction_factor=3)
    if args.wavefronts:
        wavefronts(devices, steps, asha, args.rounds)
        return
    with tempfile.TemporaryDirectory(prefix="hydra-asha-") as tmp:
        root = Path(tmp)
        specs = trials(markov_tokens(root / "tokens.npy"), steps)
        full = run(specs, devices, root / "full", None)
        pruned = run(specs, devices, root / "asha", asha)
    best_full = min(full["final"], key=full["final"].get)
    survivors = {t: v for t, v in pruned["final"].items() if pruned["states"][t] == "finished"}
    best_asha = min(survivors, key=survivors.get) if survivors else None
    print(f"full: {full['device_s']:.1f} device-s ({full['wall_s']:.1f} s wall), best {best_full} "
          f"{full['final'][best_full]:.4f}")
    print(f"asha: {pruned['device_s']:.1f} device-s ({pruned['wall_s']:.1f} s wall), states "
          f"{sorted(pruned['states'].items())}, best finished {best_asha}")
    ratio = pruned["device_s"] / full["device_s"]
    print(json.dumps({"trials": TRIALS, "device_s_full": round(full["device_s"], 2),
                      "device_s_asha": round(pruned["device_s"], 2), "ratio": round(ratio, 3),
                      "same_best": best_asha == best_full, "device": f"{args.devices} x cpu",
                      "target_met": ratio <= TARGET_RATIO and best_asha == best_full}))


def wavefronts(devices: list[Device], steps: int, asha: PrunerSpec, rounds: int) -> None:
    """The ASHA sweep with each trial on one device at most, then with wavefronts, `rounds` times (see the
    module docstring)."""
    walls: dict[str, list[float]] = {"narrow": [], "wavefronts": []}
    survivors: dict[str, list[list[str]]] = {"narrow": [], "wavefronts": []}
    bests: set[str | None] = set()
    with tempfile.TemporaryDirectory(prefix="hydra-asha-wavefronts-") as tmp:
        root = Path(tmp)
        specs = trials(markov_tokens(root / "tokens.npy"), steps, micro_batches=4)
        for r in range(rounds):
            for name, max_devices in (("narrow", 1), ("wavefronts", None)):
                result = run(specs, devices, root / f"{name}-{r}", asha, max_devices=max_devices)
                finished = {t: v for t, v in result["final"].items() if result["states"][t] == "finished"}
                best = min(finished, key=finished.get) if finished else None
                bests.add(best)
                walls[name].append(result["wall_s"])
                survivors[name].append(sorted(finished))
                print(f"round {r + 1} {name}: {result['wall_s']:.1f} s wall, {result['device_s']:.1f} device-s, "
                      f"finished {sorted(finished)}, best {best}", file=sys.stderr)
    narrow, wide = statistics.median(walls["narrow"]), statistics.median(walls["wavefronts"])
    ratio = wide / narrow
    same_best = len(bests) == 1 and None not in bests
    print(json.dumps({"trials": TRIALS, "rounds": rounds, "makespan_s_narrow": round(narrow, 2),
                      "makespan_s_wavefronts": round(wide, 2), "makespan_ratio": round(ratio, 3),
                      "survivors": survivors, "same_best": same_best, "device": f"{len(devices)} x cpu",
                      "target_met": ratio <= TARGET_MAKESPAN_RATIO and same_best}))


if __name__ == "__main__":
    main()
