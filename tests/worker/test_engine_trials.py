"""Engine trials on real device workers: plain PyTorch's numbers, bit for bit, across devices and processes
(killed, frozen and out-of-memory workers: test_kill_points.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from tests.plain_pytorch import assert_bit_identical, exported_weights, plain_reference
from tests.worker.device_workers import DeviceWorkers
from worker.contract import EngineJob, SyntheticJob
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, TrialSpec

pytestmark = pytest.mark.timeout(240)


def tiny_trial(tokens: str, *, seed: int, lr: float, steps: int = 3, width: int = 16,
               budget_bytes: int = 140_000) -> TrialSpec:
    """A 2-block GPT-2 split into several shards, with dropout, AdamW, clipping and evaluation."""
    return TrialSpec(
        model=ModelSpec(n_layer=2, n_embd=width, n_head=2, vocab_size=64, n_positions=16, dropout=0.1),
        data=DataSpec(tokens_path=tokens, seq_len=16),
        optimizer=OptimizerSpec(lr=lr),
        batch_size=4, micro_batches=2, steps=steps, eval_every=2, seed=seed, budget_bytes=budget_bytes,
    )


def trained_alone(trial: TrialSpec, root: Path) -> dict[str, torch.Tensor]:
    """The final weights of the same trial trained with plain PyTorch in this process, on one thread like a
    worker of a one-core CPU device (tests/plain_pytorch.py)."""
    return plain_reference(trial, root).weights


def exported(directory: Path) -> dict[str, torch.Tensor]:
    return exported_weights(directory)


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Bit for bit: units run in any order of devices and processes add in the same order as plain PyTorch."""
    assert_bit_identical(actual, expected)


def assert_trained_like_plain_pytorch(workers: DeviceWorkers, trial_id: str, trial: TrialSpec, root: Path) -> None:
    """The trial's step losses and evaluations (as its telemetry carries them) and exported weights are plain
    PyTorch's, bit for bit."""
    reference = plain_reference(trial, root / f"plain-{trial_id}")
    steps = sorted((s["step"], s["loss"]) for s in workers.entries("steps") if s["trial"] == trial_id)
    evals = sorted((e["step"], e["loss"]) for e in workers.entries("evals") if e["trial"] == trial_id)
    assert [loss for _, loss in steps] == reference.losses
    assert [loss for _, loss in evals] == reference.eval_losses
    assert_bit_identical(exported_weights(root / "exports" / trial_id), reference.weights)


def test_it_trains_three_trials_on_two_devices_exactly(device_workers, tokens: str, tmp_path: Path) -> None:
    trials = {f"t{i}": tiny_trial(tokens, seed=i, lr=1e-3 * (i + 1)) for i in range(3)}
    workers = device_workers("cpu0", "cpu1")
    for trial_id, trial in trials.items():
        workers.queue.submit(trial_id=trial_id, job=EngineJob(trial=trial),
                             export_dir=str(tmp_path / "exports" / trial_id))
    records = workers.wait_for_records(trials, {"finished", "failed"}, 120)
    assert {r.state for r in records.values()} == {"finished"}, [r.message for r in records.values()]
    assert all(len(r.plan["shards"]) >= 2 for r in records.values()), [r.plan for r in records.values()]

    spans = [s for s in workers.entries("spans") if s["phase"] != "plan"]
    by_device = {d: [s["trial"] for s in sorted(spans, key=lambda s: s["start"]) if s["device"] == d]
                 for d in ("cpu0", "cpu1")}
    switches = {d: sum(a != b for a, b in itertools.pairwise(ts)) for d, ts in by_device.items()}
    # Units of different trials interleave on a device (both devices work; how evenly depends on the
    # machine's load, so only one device is held to a count).
    assert all(by_device.values()) and max(switches.values()) >= 2, switches
    hopped = [t for t in trials if len({s["device"] for s in spans if s["trial"] == t}) == 2]
    assert hopped, by_device  # and trials move between devices

    steps = workers.entries("steps")
    assert sorted((s["trial"], s["step"]) for s in steps) == [(t, i) for t in trials for i in range(3)]
    assert {e["trial"] for e in workers.entries("evals")} == set(trials)
    assert {s["device"] for s in workers.entries("samples")} == {"cpu0", "cpu1"}
    assert not list(workers.spill_dir.iterdir())  # finished trials free their spill stores

    for trial_id, trial in trials.items():
        assert_trained_like_plain_pytorch(workers, trial_id, trial, tmp_path)


def test_a_pause_stops_a_trial_its_device_holds_at_the_unit_boundary_and_resume_goes_on_exactly(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    # Two of a micro-batch's three units leave activations that the device holds the trial for, and their
    # completion leases it the next unit at once (so the pause most likely lands on such a unit; the queue
    # tests pin that case down): a pending pause must still stop the trial at the unit's end.
    trial = tiny_trial(tokens, seed=5, lr=2e-3, steps=20, width=64, budget_bytes=1_500_000)
    workers = device_workers("cpu0")
    workers.queue.submit(trial_id="t", job=EngineJob(trial=trial),
                         export_dir=str(tmp_path / "exports" / "t"))
    workers.wait(lambda: workers.queue.trial("t").units_done >= 1, 60, "a first unit")
    workers.queue.pause("t")
    paused = workers.wait_for_records(["t"], {"paused"}, 30)["t"]
    assert len(paused.plan["shards"]) >= 2 and paused.units_done >= 1 and paused.remaining_units > 0
    # The device is free and takes other work meanwhile; once that trial has finished, the paused one has
    # had every chance to run: it did not.
    workers.queue.submit(trial_id="other", job=SyntheticJob(units=3), export_dir="")
    assert workers.wait_for_records(["other"], {"finished", "failed"}, 60)["other"].state == "finished"
    assert workers.queue.trial("t").units_done == paused.units_done  # nothing ran while paused
    assert workers.queue.resume("t") == "runnable"
    assert workers.wait_for_records(["t"], {"finished", "failed"}, 120)["t"].state == "finished"
    assert_trained_like_plain_pytorch(workers, "t", trial, tmp_path)


def test_trials_that_end_cancelled_or_failed_free_their_spill_stores(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    workers = device_workers("cpu0")
    queue = workers.queue
    long = tiny_trial(tokens, seed=1, lr=1e-3, steps=200)
    queue.submit(trial_id="c", job=EngineJob(trial=long),
                 export_dir=str(tmp_path / "export-c"))
    workers.wait(lambda: queue.trial("c").units_done >= 2, 60, "the first units")
    queue.pause("c")
    workers.wait_for_records(["c"], {"paused"}, 30)
    assert (workers.spill_dir / "c").is_dir()
    assert queue.cancel("c") == "cancelled"  # not running: no unit will end to clean up after it

    broken = tiny_trial(tokens, seed=2, lr=1e-3)
    queue.submit(trial_id="f", job=EngineJob(trial=broken),
                 export_dir=str(tmp_path / "export-f"))
    workers.wait(lambda: queue.trial("f").units_done >= 1, 60, "a unit of the second trial")
    queue.pause("f")
    workers.wait_for_records(["f"], {"paused"}, 30)
    (workers.spill_dir / "f" / "manifest.json").unlink()  # its next unit cannot open its store
    queue.resume("f")
    record = workers.wait_for_records(["f"], {"failed"}, 60)["f"]
    assert "failed on cpu0: WorkloadError: the spill store of trial f is gone" in record.message

    workers.wait(lambda: not list(workers.spill_dir.iterdir()), 30, "the spill stores to be freed")


@pytest.mark.parametrize(("budget_bytes", "shards"), [(140_000, 4), (4_000_000, 1)],
                         ids=["several-shards", "one-shard"])
def test_a_lone_trial_runs_its_micro_batches_on_both_devices_and_trains_exactly(
    budget_bytes: int, shards: int, device_workers, tokens: str, tmp_path: Path
) -> None:
    """No other trial waits, so the second device takes the other micro-batches of the lone trial's steps: units
    of it overlap in time on the two devices, and its numbers are plain PyTorch's (one device's). A model of one
    shard spreads the micro-batches between a step's first and last."""
    trial = tiny_trial(tokens, seed=9, lr=2e-3, steps=4, budget_bytes=budget_bytes)
    trial = TrialSpec.from_dict({**trial.to_dict(), "batch_size": 8, "micro_batches": 4})
    workers = device_workers("cpu0", "cpu1")
    workers.queue.submit(trial_id="w", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "w"))
    record = workers.wait_for_records(["w"], {"finished", "failed"}, 180)["w"]
    assert record.state == "finished", record.message
    assert (record.width_cap, record.width) == (4, 4)
    assert record.plan is not None and len(record.plan["shards"]) == shards
    spans = sorted((s for s in workers.entries("spans") if s["trial"] == "w" and s["phase"] != "plan"),
                   key=lambda s: s["start"])
    overlapping = [(a, b) for a, b in itertools.combinations(spans, 2)
                   if a["device"] != b["device"] and a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "no two units of the trial ran at once"
    assert {a["micro_batch"] != b["micro_batch"] for a, b in overlapping if a["step"] == b["step"]} <= {True}
    assert_trained_like_plain_pytorch(workers, "w", trial, tmp_path)
