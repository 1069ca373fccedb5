"""The engine runner on a CUDA GPU: an "auto" budget comes from the GPU's own memory, units of two trials
interleave on one GPU with each other's shards prefetched and still train exactly as alone, and a real
CUDA out-of-memory error in a unit re-plans the trial, which then trains on as it would have.

Skipped without a GPU. Imports neither Django nor Celery and needs no Redis server, so that
``benchmarks/gpu_check.sh`` can run it on a bare GPU machine.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from worker.contract import EngineJob
from worker.devices import cuda_device_count, host_devices
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, TrialSpec
from worker.scheduling.engine_runner import EngineRunner, device_budget_bytes
from worker.scheduling.runner import Replanned, UnitDone
from worker.scheduling.telemetry import DeviceSampler

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda", 0)  # a device worker sees only its own GPU, as cuda:0


def trial(tokens: str, *, seed: int = 3, budget_bytes: int = 1 << 30) -> TrialSpec:
    """An 8-block width-256 GPT-2 (about 100 MB of training state), with dropout and evaluation."""
    return TrialSpec(
        model=ModelSpec(n_layer=8, n_embd=256, n_head=4, vocab_size=64, n_positions=32, dropout=0.1),
        data=DataSpec(tokens_path=tokens, seq_len=32),
        optimizer=OptimizerSpec(lr=1e-3),
        batch_size=8, micro_batches=2, steps=4, eval_every=2, seed=seed, budget_bytes=budget_bytes,
    )


def units(runner: EngineRunner, trial_id: str, spec: EngineJob, *, next_trial: str | None = None
          ) -> Iterator[UnitDone | Replanned]:
    """Run the trial's units to the end, as a device loop would (one lease token throughout)."""
    done = 0
    while True:
        out = runner.run_unit(trial_id=trial_id, job=spec, units_done=done, next_trial=next_trial or trial_id,
                              token=1)
        yield out
        if isinstance(out, UnitDone):
            done += 1
            if out.remaining_units == 0:
                return


def exported(runner: EngineRunner, trial_id: str, spec: EngineJob, root: Path) -> dict[str, torch.Tensor]:
    runner.export(trial_id=trial_id, job=spec, export_dir=str(root / trial_id))
    return {name: t for path in sorted((root / trial_id).glob("*.safetensors")) for name, t in load_file(path).items()}


def assert_close_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    worst = max((actual[n] - t).abs().max().item() for n, t in expected.items())
    print(f"largest weight difference: {worst:.3g}")  # for the GPU check's log
    # A tolerance, unlike the CPU tests' bit-identity: on CUDA some kernels add with atomics in no fixed order,
    # and a re-plan changes the shards' tensor layouts, for which CUDA libraries may pick other kernels.
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_the_gpus_are_found_and_sampled_through_nvml() -> None:
    assert cuda_device_count() == torch.cuda.device_count()
    devices = host_devices("auto")
    assert [d.spec for d in devices] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert devices[0].worker_env()["CUDA_VISIBLE_DEVICES"] == "0"
    utilization, used, total = DeviceSampler._nvml_reader(0)()
    assert 0.0 <= utilization <= 1.0 and 0 < used <= total
    assert total == pytest.approx(torch.cuda.get_device_properties(0).total_memory, rel=0.05)


def test_a_gpu_plans_an_auto_budget_trial_under_its_own_memory(tokens: str, tmp_path: Path) -> None:
    free, total = torch.cuda.mem_get_info(CUDA)
    budget = device_budget_bytes(CUDA, 1)
    assert 0.8 * free <= budget <= total
    planned = EngineRunner(spill_dir=tmp_path, device=CUDA).plan(
        trial_id="t", job=EngineJob(trial=trial(tokens, budget_bytes=450_000), budget="auto"))
    assert planned.plan["budget_bytes"] > 450_000 and len(planned.plan["shards"]) == 1


def test_two_trials_interleaved_on_one_gpu_train_as_each_alone(tokens: str, tmp_path: Path) -> None:
    specs = {t: EngineJob(trial=trial(tokens, seed=i, budget_bytes=40 << 20)) for i, t in enumerate("ab")}
    expected = {}
    for trial_id, spec in specs.items():
        alone = EngineRunner(spill_dir=tmp_path / "alone", device=CUDA)
        alone.plan(trial_id=trial_id, job=spec)
        for _ in units(alone, trial_id, spec):
            pass
        expected[trial_id] = exported(alone, trial_id, spec, tmp_path / "alone-export")

    runner = EngineRunner(spill_dir=tmp_path / "shared", device=CUDA)
    shards = {t: len(runner.plan(trial_id=t, job=s).plan["shards"]) for t, s in specs.items()}
    assert min(shards.values()) > 1, shards
    # Alternate a unit of each, each unit prefetching the other trial's next shard on the copy stream.
    running = {"a": units(runner, "a", specs["a"], next_trial="b"), "b": units(runner, "b", specs["b"], next_trial="a")}
    while running:
        for trial_id in list(running):
            out = next(running[trial_id], None)
            if out is None:
                del running[trial_id]
            else:
                assert isinstance(out, UnitDone), out
    for trial_id, spec in specs.items():
        assert_close_weights(exported(runner, trial_id, spec, tmp_path / "shared-export"), expected[trial_id])


def test_a_real_out_of_memory_re_plans_the_trial_which_trains_on_as_it_would_have(
    tokens: str, tmp_path: Path
) -> None:
    spec = EngineJob(trial=trial(tokens))  # a 1 GiB budget: one shard
    reference = EngineRunner(spill_dir=tmp_path / "reference", device=CUDA)
    state_bytes = reference.plan(trial_id="t", job=spec).plan["state_bytes"]
    expected_losses = [s.loss for out in units(reference, "t", spec) for s in out.steps]
    expected = exported(reference, "t", spec, tmp_path / "expected")
    del reference
    gc.collect()

    runner = EngineRunner(spill_dir=tmp_path / "capped", device=CUDA)
    assert len(runner.plan(trial_id="t", job=spec).plan["shards"]) == 1
    # Cap this process's GPU memory at half the training state above what it holds now: the
    # one-shard unit needs the whole state, so it runs out of memory for real inside the caching allocator.
    torch.cuda.empty_cache()
    cap = torch.cuda.memory_reserved(CUDA) + state_bytes // 2
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(CUDA).total_memory, CUDA)
    try:
        outs = list(units(runner, "t", spec))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
    replans = [out for out in outs if isinstance(out, Replanned)]
    print(f"{len(replans)} re-plans; last: {replans[-1].message if replans else None}")
    assert replans and all(r.message.startswith("re-planned after out-of-memory: ") for r in replans)
    assert "CUDA out of memory" in replans[0].message
    assert len(replans[-1].plan["shards"]) > 1
    losses = [s.loss for out in outs if isinstance(out, UnitDone) for s in out.steps]
    assert losses == pytest.approx(expected_losses, rel=1e-5)  # on CUDA, not bit for bit: see assert_close_weights
    assert_close_weights(exported(runner, "t", spec, tmp_path / "actual"), expected)
