"""Sharded, spilled training gives plain PyTorch's per-step losses and final weights, bit for bit.

The reference is tests/plain_pytorch.py. On CPU with one thread every kernel adds in a fixed order, so the
engine's shards, spills and streamed optimizer steps must not change a single bit: losses compare with
``==`` and weights with ``torch.equal``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.engine.conftest import CPU, run_all, tiny_spec
from tests.plain_pytorch import Reference, assert_bit_identical, exported_weights, initial_weights, plain_training
from worker.engine import OptimizerSpec, TrialSession, trial_create
from worker.engine.schedule import lr_factor

PLANS = {"1-shard": [0], "2-shards": [0, 3], "3-shards": [0, 2, 4], "per-layer": [0, 1, 2, 3, 4, 5]}
OPTIMIZERS = {
    "adamw": OptimizerSpec(kind="adamw", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip_norm=0.5),
    "sgd": OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01, clip_norm=0.5),
}


@pytest.fixture(scope="module")
def references(tokens_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    out = {}
    for kind, optimizer in OPTIMIZERS.items():
        spec = tiny_spec(tokens_path, optimizer=optimizer)
        assert lr_factor(spec.schedule, 10, spec.steps) == 0.5 * (1 + math.cos(math.pi * 7 / 17))
        out[kind] = plain_training(initial_weights(spec, tmp_path_factory.mktemp(f"reference-{kind}")), spec)
    return out


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_it_trains_exactly_like_plain_pytorch(
    kind: str, plan: str, tier: str, references: dict[str, Reference], tokens_path: Path, tmp_path: Path,
    shm_dir: Path,
) -> None:
    spill_dir = shm_dir if tier == "host" else tmp_path
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS[kind])
    created = trial_create(spec=spec, spill_dir=spill_dir, trial_id="t", device=CPU, cuts=PLANS[plan])
    assert len(created.shards) == len(PLANS[plan])
    session = TrialSession.open(spill_dir=spill_dir, trial_id="t", device=CPU)
    results = run_all(session)
    session.export(tmp_path / "final")
    reference = references[kind]

    losses = [r.loss for r in results if r.loss is not None]
    eval_losses = [r.eval_loss for r in results if r.eval_loss is not None]
    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(exported_weights(tmp_path / "final"), reference.weights)


def test_it_recomputes_instead_of_keeping_with_the_same_numbers(
    references: dict[str, Reference], tokens_path: Path, tmp_path: Path
) -> None:
    numbers = {}
    for policy in ("auto", "recompute"):
        spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS["adamw"], activations=policy)
        plan = trial_create(spec=spec, spill_dir=tmp_path, trial_id=policy, device=CPU, cuts=PLANS["3-shards"])
        # On CPU keeping costs no copy, so "auto" keeps every shard but the last (whose unit is FB).
        assert [s.keep_activations for s in plan.shards] == ([True, True, False] if policy == "auto" else [False] * 3)
        session = TrialSession.open(spill_dir=tmp_path, trial_id=policy, device=CPU)
        results = run_all(session)
        numbers[policy] = [r.loss for r in results if r.loss is not None]
        backward_reads = sum(r.bytes_read for r in results if r.unit.phase == "B")
        numbers[f"{policy}-reads"] = backward_reads
    assert numbers["auto"] == numbers["recompute"] == references["adamw"].losses
    assert numbers["auto-reads"] < numbers["recompute-reads"]  # kept graphs need no saved input or RNG state


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_it_streams_the_optimizer_step_in_chunks_exactly(
    kind: str, references: dict[str, Reference], tokens_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.engine.optimizer_step.STEP_CHUNK", 1000)  # shards hold ~13k-30k parameters
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS[kind])
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=PLANS["2-shards"])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    run_all(session)
    session.export(tmp_path / "final")
    assert_bit_identical(exported_weights(tmp_path / "final"), references[kind].weights)
