"""DPO trials on real device workers: a beta sweep of LoRA trials on one shared base and a full fine-tune with its
reference pass train exactly like a plain PyTorch DPO loop, report their rewards with each step, and a worker
killed before committing reference log-probabilities costs nothing but the unit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.test_dpo import N_PAIRS, dpo_spec, random_pairs
from tests.engine.test_examples_training import save_base
from tests.plain_pytorch import (
    Reference,
    assert_bit_identical,
    exported_weights,
    initial_weights,
    one_thread,
    plain_dpo_training,
)
from tests.worker.test_kill_points import (
    assert_each_once_in_wavefront_order,
    blocked,
    completed,
    completed_on,
    start,
)
from worker.contract import EngineJob
from worker.engine import ModelSpec, TrialSession, TrialSpec, trial_create
from worker.engine.config import DpoSpec, LoraSpec
from worker.engine.lora import ADAPTER_DIR
from worker.engine.pairs import save_pairs
from worker.engine.shared_base import bases

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

FULL_BUDGET, LORA_BUDGET = 1_500_000, 800_000  # 5 and 3 shards of the tiny Llama


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    save_pairs(random_pairs(N_PAIRS, seed=11), tmp_path / "pairs")
    return tmp_path / "pairs"


def full_trial(pairs: Path) -> TrialSpec:
    return dpo_spec(pairs, packing=True, steps=3, eval_every=2, budget_bytes=FULL_BUDGET)


def lora_trial(pairs: Path, base: Path, *, beta: float) -> TrialSpec:
    return dpo_spec(pairs, steps=3, eval_every=2, budget_bytes=LORA_BUDGET, model=ModelSpec(pretrained_dir=str(base)),
                    lora=LoraSpec(r=4, alpha=8.0, dropout=0.1, target_modules=("q_proj", "v_proj")),
                    dpo=DpoSpec(beta=beta))


def plain(trial: TrialSpec, root: Path) -> Reference:
    with one_thread():
        return plain_dpo_training(initial_weights(trial, root), trial)


def assert_trained_like_plain_dpo(workers, trial_id: str, trial: TrialSpec, exports: Path, root: Path) -> None:
    reference = plain(trial, root / f"plain-{trial_id}")
    steps = sorted((s["step"], s["loss"], (s["rewards_chosen"], s["rewards_rejected"], s["reward_accuracy"]))
                   for s in workers.entries("steps") if s["trial"] == trial_id)
    assert [loss for _, loss, _ in steps] == reference.losses
    assert [rewards for *_, rewards in steps] == reference.rewards
    evals = sorted((e["step"], e["loss"], e["reward_accuracy"]) for e in workers.entries("evals")
                   if e["trial"] == trial_id)
    assert [loss for _, loss, _ in evals] == reference.eval_losses
    assert [accuracy for *_, accuracy in evals] == [accuracy for *_, accuracy in reference.eval_rewards]
    if trial.lora is not None:
        trained = load_file(exports / trial_id / ADAPTER_DIR / "adapter_model.safetensors")
    else:
        trained = exported_weights(exports / trial_id)
    assert_bit_identical(trained, reference.weights)


def test_a_beta_sweep_on_a_shared_base_and_a_full_fine_tune_train_exactly_on_two_devices(
    shared_device_workers, pairs: Path, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base", "llama")
    trials = {"dpo-b1": lora_trial(pairs, base, beta=0.1), "dpo-b5": lora_trial(pairs, base, beta=0.5),
              "dpo-full": full_trial(pairs)}
    workers = shared_device_workers
    for trial_id, trial in trials.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial),
                             export_dir=str(tmp_path / "exports" / trial_id))
    workers.wait(lambda: any(len(b["trials"]) == 2 for b in bases(workers.spill_dir)), 60,
                 "the two LoRA trials to be planned on one shared base")
    records = workers.wait_for_records(trials, {"finished", "failed"}, 240)
    assert {r.state for r in records.values()} == {"finished"}, [r.message for r in records.values()]
    assert len(records["dpo-full"].plan["shards"]) >= 2 and len(records["dpo-b1"].plan["shards"]) >= 2
    phases = {s["phase"] for s in workers.entries("spans") if s["trial"] == "dpo-full"}
    assert "R" in phases

    for trial_id, trial in trials.items():
        assert_trained_like_plain_dpo(workers, trial_id, trial, tmp_path / "exports", tmp_path)


def test_a_worker_killed_before_committing_reference_log_probabilities_is_recovered_from_exactly(
    device_workers, pairs: Path, tmp_path: Path
) -> None:
    """The worker running the last shard's unit of the second reference batch is killed once it has written the
    chunk of log-probabilities (the first batch's and its own) and before its commit: the other device runs the
    unit again from the committed chunk and the trial is the plain loop's."""
    trial = dataclasses.replace(full_trial(pairs), steps=2)
    trial_create(spec=trial, spill_dir=tmp_path / "probe", trial_id="probe", device=torch.device("cpu"))
    timetable = TrialSession.open(spill_dir=tmp_path / "probe", trial_id="probe", device=torch.device("cpu")).timetable
    units = [(u.step, u.micro_batch, u.phase, u.shard) for u in timetable]
    target = units.index((0, 1, "R", timetable.shards - 1))
    workers = start(device_workers, tmp_path, f"before-commit@{target}")
    workers.queue.submit(trial_id="k", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "k"))
    victim, _ = blocked(workers, tmp_path)
    workers.kill(victim)
    record = workers.wait_for_records(["k"], {"finished", "failed"}, 180)["k"]
    assert (record.state, record.requeues) == ("finished", 1), record.message
    done = completed(workers, "k")
    assert_each_once_in_wavefront_order(done, timetable)
    assert completed_on(done, units[target]) != victim
    assert_trained_like_plain_dpo(workers, "k", trial, tmp_path / "exports", tmp_path)
