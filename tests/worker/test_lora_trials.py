"""LoRA trials on real device workers: several trials on one base share the host's one frozen copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from tests.plain_pytorch import assert_bit_identical, plain_reference
from tests.worker.test_kill_points import (
    assert_each_once_in_wavefront_order,
    blocked,
    completed,
    completed_on,
    start,
    timetable,
)
from worker.contract import EngineJob
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, TrialSpec
from worker.engine.config import LoraSpec
from worker.engine.lora import ADAPTER_DIR
from worker.engine.schedule import Timetable
from worker.engine.shared_base import BASES, bases

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]


def lora_trial(tokens: str, base: Path, *, seed: int, lr: float, r: int) -> TrialSpec:
    return TrialSpec(
        model=ModelSpec(pretrained_dir=str(base)), data=DataSpec(tokens_path=tokens, seq_len=16),
        optimizer=OptimizerSpec(lr=lr), batch_size=4, micro_batches=2, steps=3, eval_every=2, seed=seed,
        budget_bytes=250_000, lora=LoraSpec(r=r, alpha=2.0 * r, dropout=0.1, target_modules=("q_proj", "v_proj")),
    )


def save_base(base: Path) -> Path:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                     max_position_embeddings=16)).save_pretrained(base)
    return base


def assert_trained_like_peft(workers, trial_id: str, trial: TrialSpec, tmp_path: Path) -> None:
    reference = plain_reference(trial, tmp_path / f"plain-{trial_id}")
    steps = sorted((s["step"], s["loss"]) for s in workers.entries("steps") if s["trial"] == trial_id)
    assert [loss for _, loss in steps] == reference.losses
    adapter = load_file(tmp_path / "exports" / trial_id / ADAPTER_DIR / "adapter_model.safetensors")
    assert_bit_identical(adapter, reference.weights)


def test_three_lora_trials_share_one_base_on_two_devices_and_train_exactly(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base")
    trials = {f"l{i}": lora_trial(tokens, base, seed=i, lr=5e-3 * (i + 1), r=2 + 2 * i) for i in range(3)}
    workers = device_workers("cpu0", "cpu1")
    for trial_id, trial in trials.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial),
                             export_dir=str(tmp_path / "exports" / trial_id))
    workers.wait(lambda: len(bases(workers.spill_dir)) == 1 and len(bases(workers.spill_dir)[0]["trials"]) == 3,
                 60, "the three trials to be planned on one shared base")
    records = workers.wait_for_records(trials, {"finished", "failed"}, 180)
    assert {r.state for r in records.values()} == {"finished"}, [r.message for r in records.values()]
    assert all(len(r.plan["shards"]) >= 2 for r in records.values()), [r.plan for r in records.values()]
    # The last trial to end let the base go: nothing of any trial is left on the host.
    assert bases(workers.spill_dir) == []
    assert [p.name for p in workers.spill_dir.iterdir()] == [BASES]

    for trial_id, trial in trials.items():
        assert_trained_like_peft(workers, trial_id, trial, tmp_path)


def test_a_lora_trial_whose_worker_is_killed_mid_unit_trains_on_exactly_from_the_shared_base(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    """The worker running the first forward unit of step 1 is killed while writing it: the other device runs
    the unit again, reading the base the host still holds, and the adapters are PEFT's."""
    trial = lora_trial(tokens, save_base(tmp_path / "base"), seed=5, lr=1e-2, r=4)
    units = timetable(trial, tmp_path / "probe")
    target = units.index((1, 0, "F", 0))
    workers = start(device_workers, tmp_path, f"mid-write@{target}")
    workers.queue.submit(trial_id="k", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "k"))
    victim, _ = blocked(workers, tmp_path)
    workers.kill(victim)
    record = workers.wait_for_records(["k"], {"finished", "failed"}, 120)["k"]
    assert (record.state, record.requeues) == ("finished", 1), record.message
    done = completed(workers, "k")
    assert_each_once_in_wavefront_order(done, Timetable.of(trial, shards=len({u[3] for u in units})))
    assert completed_on(done, units[target]) != victim
    assert bases(workers.spill_dir) == []
    assert_trained_like_peft(workers, "k", trial, tmp_path)


def test_a_lora_trial_out_of_memory_mid_backward_is_replanned_and_stays_exact(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    """Out of memory in the backward of step 1's last shard: the trial is re-planned under a smaller budget
    and goes on from the step in flight; its adapters are PEFT's."""
    trial = lora_trial(tokens, save_base(tmp_path / "base"), seed=6, lr=1e-2, r=4)
    units = timetable(trial, tmp_path / "probe")
    last = max(shard for *_, shard in units)
    target = units.index((1, 0, "FB", last))
    workers = start(device_workers, tmp_path, f"mid-backward:oom@{target}", lease_s=10.0)
    workers.queue.submit(trial_id="o", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "o"))
    record = workers.wait_for_records(["o"], {"finished", "failed"}, 180)["o"]
    assert (record.state, record.replans) == ("finished", 1), record.message
    assert record.plan["budget_bytes"] <= int(trial.budget_bytes * 0.75)
    assert_trained_like_peft(workers, "o", trial, tmp_path)
