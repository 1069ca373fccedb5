"""ASHA on real device workers: a random search over learning rates where the good region is known.

Nine tiny trials draw their learning rate log-uniformly from 1e-4 to 1e-2; on this data a larger rate learns
faster at every step, so the best trial is known (and checked with plain PyTorch). With asynchronous successive halving
(2 steps at the first rung, reduction factor 3) the best trial trains to the end, the others stop at rungs,
and each pruned trial's exported weights are those of plain PyTorch training it alone to its last step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.plain_pytorch import assert_bit_identical, exported_weights, plain_reference
from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob, PrunerSpec, PruningJob
from worker.scheduling import pruning

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

STEPS = 18
ASHA = PrunerSpec(kind="asha", min_resource=2, reduction_factor=3)
RUNGS = {2, 6}  # 2 x 3 ** k below the last step


@pytest.fixture
def markov_tokens(tmp_path: Path) -> str:
    """Tokens that mostly follow one another by a fixed rule (the rest random): there is something to learn,
    and a larger learning rate learns it faster within the trials' few steps."""
    rng = np.random.default_rng(0)
    ids = [0]
    for _ in range(16383):
        ids.append((ids[-1] * 5 + 3) % 64 if rng.random() < 0.9 else int(rng.integers(0, 64)))
    path = tmp_path / "markov.npy"
    np.save(path, np.asarray(ids, dtype=np.int32))
    return str(path)


def learning_rates(n: int, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [10 ** rng.uniform(math.log10(1e-4), math.log10(1e-2)) for _ in range(n)]


def test_asha_keeps_the_best_trial_and_stops_the_others_at_rungs_with_their_weights_exact(
        device_workers, markov_tokens: str, tmp_path: Path) -> None:
    study = f"test-{uuid.uuid4().hex[:10]}"
    trials = {f"t{n}": dataclasses.replace(tiny_trial(markov_tokens, seed=0, lr=lr, steps=STEPS), eval_every=2)
              for n, lr in enumerate(learning_rates(9), start=1)}
    full = {trial_id: plain_reference(trial, tmp_path / f"full-{trial_id}") for trial_id, trial in trials.items()}
    best = min(trials, key=lambda trial_id: full[trial_id].eval_losses[-1])
    assert best == max(trials, key=lambda trial_id: trials[trial_id].optimizer.lr)  # the known good region

    workers = device_workers("cpu0", "cpu1")
    try:
        for n, (trial_id, trial) in enumerate(trials.items(), start=1):
            job = EngineJob(trial=trial, pruning=PruningJob(study=study, trial_number=n, pruner=ASHA))
            workers.queue.submit(trial_id=trial_id, export_dir=str(tmp_path / "exports" / trial_id), job=job)
        records = workers.wait_for_records(trials, {"finished", "pruned", "failed"}, 240)
        steps = {trial_id: max(s["step"] for s in workers.entries("steps") if s["trial"] == trial_id) + 1
                 for trial_id in trials}
        events = [e for e in workers.queue.client.xrange(workers.queue.key("events")) if e[1].get("state") == "pruned"]
        studied = workers.queue.client.hgetall(pruning.study_key(study))
    finally:
        pruning.forget(workers.queue.client, study)

    states = {trial_id: r.state for trial_id, r in records.items()}
    assert states[best] == "finished", (states, [r.message for r in records.values()])
    pruned = [trial_id for trial_id, state in states.items() if state == "pruned"]
    assert pruned and set(states.values()) == {"finished", "pruned"}, states
    for trial_id in pruned:
        assert steps[trial_id] in RUNGS, (trial_id, steps[trial_id])
        assert records[trial_id].message.startswith(f"pruned at rung {sorted(RUNGS).index(steps[trial_id])} ")
        alone = plain_reference(trials[trial_id], tmp_path / f"alone-{trial_id}", steps_run=steps[trial_id])
        assert_bit_identical(exported_weights(tmp_path / "exports" / trial_id), alone.weights)
    for trial_id in set(trials) - set(pruned):
        assert steps[trial_id] == STEPS
    # The ended events carry each pruned trial's rung, and the study recorded every evaluation it decided on.
    assert {e[1]["trial"]: int(e[1]["rung"]) for e in events} == {
        t: sorted(RUNGS).index(steps[t]) for t in pruned}
    for n, trial_id in enumerate(trials, start=1):
        record = json.loads(studied[str(n)])
        assert record["state"] == {"pruned": "pruned", "finished": "complete"}[states[trial_id]]
        assert max(map(int, record["values"])) == steps[trial_id]
