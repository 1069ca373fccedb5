"""The micro-batches of a step run on several devices at once (a wavefront) and give the numbers of one device.

Micro-batch m's unit on a shard runs after micro-batch m - 1's unit of the same phase on that shard, and after
the unit before it in its own micro-batch; every shard then sees the same operations in the same order as on one
device, so the losses, evaluations and trained weights are bit-identical on CPU. The devices are simulated in
one process (`tests/engine/wavefront.py`): they take their lanes before any computes and commit in reverse
order, so every commit of a round but the first merges onto the others'.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all, tiny_spec
from tests.engine.test_dpo import dpo_spec
from tests.engine.test_dpo import pairs_dir as pairs_dir
from tests.engine.test_examples_training import example_spec
from tests.engine.test_examples_training import examples_dir as examples_dir
from tests.engine.test_lora import lora_spec, save_base
from tests.engine.wavefront import run_wavefront
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_dpo_training
from worker.engine import ModelSpec, TrialSession, TrialSpec, UnitResult, spill_pool, trial_create
from worker.engine.config import LoraSpec
from worker.engine.durable import checkpoint, restore_from_checkpoint
from worker.engine.errors import LaneNotReady, StaleWriterError
from worker.engine.lora import ADAPTER_DIR
from worker.engine.repartition import repartition
from worker.engine.schedule import Timetable
from worker.engine.spill_pool import POOL_MIN_BYTES
from worker.engine.spill_store import SpillStore


def figures(results: list[UnitResult]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    losses = sorted((r.unit.step, r.loss) for r in results if r.loss is not None)
    evals = sorted((r.unit.step, r.eval_loss) for r in results if r.eval_loss is not None)
    return losses, evals


def trained(spec: TrialSpec, root: Path, cuts: list[int], devices: int) -> tuple[list, list, Path, int]:
    """Train `spec` on `devices` devices (1: in timetable order, one session); its figures, export and the most
    of its units that ran at once."""
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=cuts)
    if devices == 1:
        session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
        results, widest = run_all(session), 1
    else:
        run = run_wavefront(root, "t", devices)
        results, widest = run.results, run.widest
        session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    # A micro-batch's boundaries, tied gradients and RNG states (a{m}.{s}, ...) go with the unit that reads
    # them last.
    assert not [name for name in session.store.buffers if "." in name]
    session.export(root / "final")
    session.close()
    return (*figures(results), root / "final", widest)


def weights_of(export: Path, spec: TrialSpec) -> dict[str, torch.Tensor]:
    if spec.lora is not None:
        return load_file(export / ADAPTER_DIR / "adapter_model.safetensors")
    return exported_weights(export)


def gpt2_tied(tokens_path: Path, _: Path) -> TrialSpec:
    """Dropout, AdamW with weight decay, clipping, the tied LM head; 4 micro-batches of 1 row."""
    return tiny_spec(tokens_path, micro_batches=4, steps=4, eval_every=2, eval_batches=3)


def llama_untied(tokens_path: Path, _: Path) -> TrialSpec:
    spec = tiny_spec(tokens_path, micro_batches=4, steps=3, eval_every=3, eval_batches=2)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, family="llama", n_kv_head=2,
                                                                 tie_word_embeddings=False))


def lora(tokens_path: Path, root: Path) -> TrialSpec:
    return lora_spec(tokens_path, save_base(root / "base", "llama"), "llama", micro_batches=4, steps=3)


CASES = {"gpt2-tied": (gpt2_tied, [0, 2, 4, 5]), "llama-untied": (llama_untied, [0, 1, 3]),
         "lora": (lora, [0, 1, 2, 3])}


@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_a_wavefront_trains_bit_for_bit_as_one_device(case: str, devices: int, tokens_path: Path,
                                                      tmp_path: Path) -> None:
    make, cuts = CASES[case]
    spec = make(tokens_path, tmp_path)
    one = trained(spec, tmp_path / "one", cuts, devices=1)
    many = trained(spec, tmp_path / "many", cuts, devices=devices)

    assert many[3] == devices  # the wavefront did run that wide
    assert many[0] == one[0] and many[1] == one[1]
    assert_bit_identical(weights_of(many[2], spec), weights_of(one[2], spec))


def test_the_final_updates_run_on_every_device_at_once_bit_for_bit(tokens_path: Path, tmp_path: Path) -> None:
    """A trial that ends without an evaluation applies its last step shard by shard (S units): no shard's update
    reads another's, so they run side by side, merging their commits, and the weights are one device's."""
    spec = tiny_spec(tokens_path, micro_batches=2, steps=3, eval_every=0)  # tied head, clipping, AdamW
    cuts = [0, 1, 2, 3, 4, 5]
    one = trained(spec, tmp_path / "one", cuts, devices=1)
    trial_create(spec=spec, spill_dir=tmp_path / "many", trial_id="t", device=CPU, cuts=cuts)
    run = run_wavefront(tmp_path / "many", "t", 2)
    # Rounds of two, each committed in reverse order: both devices ran a final update in every round.
    assert [r.unit.shard for r in run.results if r.unit.phase == "S"] == [1, 0, 3, 2, 5, 4]
    session = TrialSession.open(spill_dir=tmp_path / "many", trial_id="t", device=CPU)
    session.export(tmp_path / "many-final")
    session.close()
    assert figures(run.results) == (one[0], one[1])
    assert_bit_identical(weights_of(tmp_path / "many-final", spec), weights_of(one[2], spec))


def test_packed_chat_examples_train_as_a_wavefront_bit_for_bit(examples_dir: Path, tmp_path: Path) -> None:
    spec = example_spec(examples_dir, packing=True, micro_batches=4, steps=4)
    one = trained(spec, tmp_path / "one", [0, 2, 4], devices=1)
    many = trained(spec, tmp_path / "many", [0, 2, 4], devices=3)
    assert many[0] == one[0] and many[1] == one[1]
    assert_bit_identical(weights_of(many[2], spec), weights_of(one[2], spec))


def one_shard(case: str, tokens_path: Path, examples_dir: Path, root: Path) -> TrialSpec:
    """The trials of the cases above with 6 micro-batches of 1 row and evaluations of 5 batches: 4 micro-batches of
    a step, 3 batches of an evaluation run side by side."""
    if case == "packed-chat":
        return example_spec(examples_dir, packing=True, batch_size=6, micro_batches=6, steps=3, eval_every=1,
                            eval_batches=5)
    return dataclasses.replace(CASES[case][0](tokens_path, root), batch_size=6, micro_batches=6, eval_every=1,
                               eval_batches=5)


@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("case", [*CASES, "packed-chat"])
def test_a_model_of_one_shard_spreads_its_micro_batches_bit_for_bit(case: str, devices: int, tokens_path: Path,
                                                                    examples_dir: Path, tmp_path: Path) -> None:
    """A model planned as one shard: the micro-batches between a step's first and last run side by side, those
    that end before the ones ahead of them park their gradients, and the sums come out as on one device."""
    spec = one_shard(case, tokens_path, examples_dir, tmp_path)
    one = trained(spec, tmp_path / "one", [0], devices=1)
    many = trained(spec, tmp_path / "many", [0], devices=devices)

    assert many[3] == devices
    assert many[0] == one[0] and many[1] == one[1]
    assert_bit_identical(weights_of(many[2], spec), weights_of(one[2], spec))


def preference_figures(results: list[UnitResult]) -> tuple[list, list]:
    """A DPO trial's step and evaluation figures, by step."""
    return (sorted((r.unit.step, r.loss, r.rewards_chosen, r.rewards_rejected, r.reward_accuracy)
                   for r in results if r.loss is not None),
            sorted((r.unit.step, r.eval_loss, r.eval_ppl, r.eval_rewards_chosen, r.eval_rewards_rejected,
                    r.eval_reward_accuracy) for r in results if r.eval_loss is not None))


@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_preference_trial_of_one_shard_spreads_its_micro_batches_bit_for_bit(lora: bool, devices: int,
                                                                              pairs_dir: Path, tmp_path: Path) -> None:
    """DPO on pairs, one shard, 6 micro-batches of one pair and evaluations of 5: a micro-batch that ends ahead of
    its turn parks its loss and reward parts with its gradient (an evaluation batch its pairs' sums), and the steps'
    losses, rewards and accuracies, the evaluations and the weights come out as on one device, and as a plain
    PyTorch DPO loop's."""
    overrides: dict[str, object] = {}
    if lora:
        overrides = {"model": ModelSpec(pretrained_dir=str(save_base(tmp_path / "base", "llama"))),
                     "lora": LoraSpec(r=4, alpha=8.0, dropout=0.1, target_modules=("q_proj", "v_proj"))}
    spec = dpo_spec(pairs_dir, batch_size=12, micro_batches=6, steps=3, eval_every=1, eval_batches=5, **overrides)
    plain = plain_dpo_training(initial_weights(spec, tmp_path / "reference"), spec)
    runs = {}
    for width in (1, devices):
        root = tmp_path / f"on-{width}"
        trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0])
        if width == 1:
            results, widest = run_all(TrialSession.open(spill_dir=root, trial_id="t", device=CPU)), 1
        else:
            run = run_wavefront(root, "t", width)
            results, widest = run.results, run.widest
        session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
        assert not [name for name in session.store.buffers if name.startswith("h")]
        session.export(root / "final")
        session.close()
        runs[width] = (preference_figures(results), weights_of(root / "final", spec), widest)

    (steps, evals), weights, widest = runs[devices]
    assert widest == devices
    assert (steps, evals) == runs[1][0]
    assert_bit_identical(weights, runs[1][1])
    assert [loss for _, loss, *_ in steps] == plain.losses
    assert [tuple(rewards) for _, _, *rewards in steps] == plain.rewards
    assert [loss for _, loss, *_ in evals] == plain.eval_losses
    assert_bit_identical(weights, plain.weights)


def test_a_step_of_one_shard_parks_and_adds_its_gradients_in_micro_batch_order(tokens_path: Path,
                                                                               tmp_path: Path) -> None:
    """The 4 micro-batches of a step of one shard may start in any order, and its S unit runs after them. Run 2,
    then 3, then 0, then 1: 2 and 3 park their gradients; 0 starts the sum and 1 adds its own; the S unit adds
    2's and 3's, takes the norm, reports the step and applies its update. The step ends as one device's."""
    spec = tiny_spec(tokens_path, micro_batches=4, steps=2, eval_every=0)
    one = trained(spec, tmp_path / "one", [0], devices=1)
    root = tmp_path / "many"
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0])
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    tokens = itertools.count(1)
    assert session.ready_lanes() == [0, 1, 2, 3]
    for lane in (2, 3):
        assert session.run_unit(token=next(tokens), lane=lane).loss is None
    assert {"h2.0", "h3.0"} <= set(session.store.buffers) and sorted(session.state.step_state.parked) == [2, 3]
    for lane in (0, 1):
        assert session.run_unit(token=next(tokens), lane=lane).loss is None
    assert sorted(session.state.step_state.parked) == [2, 3] and session.ready_lanes() == [0]
    result = session.run_unit(token=next(tokens), lane=0)
    assert result.unit.phase == "S"
    assert not {"h2.0", "h3.0"} & set(session.store.buffers) and not session.state.step_state.parked
    assert (result.unit.step, result.loss) == one[0][0]
    assert session.ready_lanes() == [0, 1, 2, 3]  # the next step's micro-batches need nothing of each other
    session.close()
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    results = run_all(session)
    session.export(root / "final")
    assert figures(results)[0] == one[0][1:]
    assert_bit_identical(exported_weights(root / "final"), exported_weights(one[2]))


def test_a_step_update_of_one_shard_writes_over_files_the_store_keeps(tokens_path: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-shard step's S unit writes the weights and both moments while the step's parked gradients are still
    committed. From the second step on it writes them over files the store's pool kept from the step before (a new
    file costs the kernel every page of it), though the next micro-batches take pooled files for theirs first."""
    model = ModelSpec(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ, dropout=0.1)
    spec = tiny_spec(tokens_path, model=model, batch_size=3, micro_batches=3, steps=4, eval_every=0)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert 4 * session.layout.numel[0] > POOL_MIN_BYTES  # the model's buffers are large enough to be pooled
    claims: list[tuple[str, bool]] = []
    claim = spill_pool.claim

    def recorded(root: Path, path: Path, nbytes: int | None, writer: str) -> bool:
        hit = claim(root, path, nbytes, writer)
        if nbytes is not None and nbytes >= POOL_MIN_BYTES:
            claims.append((path.name.split("@")[0], hit))
        return hit

    monkeypatch.setattr(spill_pool, "claim", recorded)
    tokens = itertools.count(1)
    updates = []
    for step in range(spec.steps):
        for lane in (2, 1, 0):  # 2 and 1 park their gradients; the S unit adds them
            session.run_unit(token=next(tokens), lane=lane)
        claims.clear()
        result = session.run_unit(token=next(tokens), lane=0)
        assert (result.unit.phase, result.unit.step) == ("S", step)
        updates.append(sorted(claims))
    assert updates[0] == [("m0", False), ("p0", False), ("v0", False)]  # the first step superseded none it could take
    assert updates[1:] == [[("m0", True), ("p0", True), ("v0", True)]] * (spec.steps - 1)


def test_a_trial_of_one_shard_stored_before_step_units_keeps_its_timetable(tokens_path: Path, tmp_path: Path) -> None:
    """A store written before a step of one shard ended with an S unit: its first micro-batch applies the update
    and runs first, its last after every other, and on 2 devices it trains as on one."""
    spec = tiny_spec(tokens_path, micro_batches=4, steps=3, eval_every=2, eval_batches=3)
    one = trained(spec, tmp_path / "one", [0], devices=1)
    root = tmp_path / "before"
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0])
    store = SpillStore.take(root / "t", 1)
    store.manifest["step_units"] = False
    store.commit()
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    assert session.ready_lanes() == [0] and "S" not in {unit.phase for unit in session.timetable}
    session.run_unit(token=2, lane=0)
    assert session.ready_lanes() == [1, 2]
    session.close()
    run = run_wavefront(root, "t", 2, first_token=3)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    session.export(root / "final")
    assert run.widest == 2
    assert figures(run.results) == (one[0], one[1])
    assert_bit_identical(exported_weights(root / "final"), exported_weights(one[2]))


def test_a_checkpoint_with_a_parked_gradient_resumes_bit_for_bit(tokens_path: Path, tmp_path: Path) -> None:
    """A checkpoint taken while a micro-batch's gradient is parked, restored after the host lost its store,
    trains on to the weights of an uninterrupted run."""
    spec = tiny_spec(tokens_path, micro_batches=4, steps=2, eval_every=0)
    one = trained(spec, tmp_path / "one", [0], devices=1)
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=[0])
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    for token, lane in enumerate([0, 2], start=1):
        session.run_unit(token=token, lane=lane)
    assert session.state.step_state.parked
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t") is not None
    session.close()
    for path in (spill / "t").iterdir():
        path.unlink()
    (spill / "t").rmdir()
    assert restore_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, trial_id="t") is not None
    restored = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    run = run_wavefront(spill, "t", 2, first_token=10)
    restored.close()
    TrialSession.open(spill_dir=spill, trial_id="t", device=CPU).export(tmp_path / "final")
    assert figures(run.results)[0] == one[0]
    assert_bit_identical(exported_weights(tmp_path / "final"), exported_weights(one[2]))


def test_lanes_become_ready_as_a_staircase(tokens_path: Path, tmp_path: Path) -> None:
    """3 shards, 3 micro-batches: a lane's unit needs the one before it and the previous lane's at its place."""
    spec = tiny_spec(tokens_path, batch_size=3, micro_batches=3, steps=1, eval_every=0)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    seen = []
    tokens = itertools.count(2)

    def step(lane: int) -> str:
        unit = session.run_unit(token=next(tokens), lane=lane).unit
        seen.append((unit.micro_batch, unit.phase, unit.shard, session.ready_lanes()))
        return f"{unit.phase}{unit.shard}"

    assert session.ready_lanes() == [0]
    with pytest.raises(LaneNotReady):
        session.run_unit(token=1, lane=1)
    assert step(0) == "F0" and session.ready_lanes() == [0, 1]
    assert step(1) == "F0" and session.ready_lanes() == [0, 2]  # lane 1's F1 needs lane 0's F1
    assert step(0) == "F1" and session.ready_lanes() == [0, 1, 2]
    assert [step(2), step(0), step(1)] == ["F0", "FB2", "F1"]
    assert session.ready_lanes() == [0, 1, 2]
    assert [step(0), step(0)] == ["B1", "B0"]
    assert session.ready_lanes() == [1, 2]
    assert [step(1), step(1), step(1), step(2), step(2), step(2), step(2)] == ["FB2", "B1", "B0", "F1", "FB2",
                                                                                   "B1", "B0"]
    assert session.ready_lanes() == [0, 1, 2]  # the final updates: a lane per shard, none waiting for another
    timetable = Timetable.of(spec, shards=3)
    assert session.state.units_committed == timetable.train_units_per_step == 15
    assert session.remaining_units() == len(timetable) - 15 == 3


def test_ready_lanes_come_most_urgent_first(tokens_path: Path, tmp_path: Path) -> None:
    """A lane that fell behind is reported before the lanes ahead of it: its chain of units left is the longest."""
    spec = tiny_spec(tokens_path, batch_size=3, micro_batches=3, steps=1, eval_every=0)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    for token, lane in enumerate([0, 0, 0], start=2):  # lane 0: F0, F1, FB2
        session.run_unit(token=token, lane=lane)
    assert session.ready_lanes() == [1, 0]  # lane 1 at its first unit (4 + 1 to follow) before lane 0's B1 (1 + 1)
    session.run_unit(token=5, lane=1)
    assert session.ready_lanes() == [1, 2, 0]  # lanes 1 and 2 tie (2 + 2 units to follow): the lower first


def test_a_lane_writer_a_newer_one_took_over_is_refused_while_other_lanes_merge(tokens_path: Path,
                                                                                 tmp_path: Path) -> None:
    """Lane 1's first writer stalls before its commit; a newer writer re-runs lane 1's unit, and lane 0 goes on
    meanwhile: the stale writer is refused, its files are gone, and the trial ends as one device trains it."""
    spec = tiny_spec(tokens_path, micro_batches=2, steps=2, eval_every=0)
    one = trained(spec, tmp_path / "one", [0, 3], devices=1)
    root = tmp_path / "many"
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0, 3])
    stale, newer, other = (TrialSession.open(spill_dir=root, trial_id="t", device=CPU) for _ in range(3))
    other.run_unit(token=1, lane=0)  # F0 of micro-batch 0: lane 1 may start
    reached, release = threading.Event(), threading.Event()

    class Stall:
        def reach(self, point: str, *, trial_id: str, unit: int) -> None:
            if point == "before-commit":
                reached.set()
                release.wait(60)

    stale.fault = Stall()  # type: ignore[assignment]
    refused: list[BaseException] = []

    def run_stale() -> None:
        try:
            stale.run_unit(token=2, lane=1)
        except StaleWriterError as error:
            refused.append(error)

    thread = threading.Thread(target=run_stale)
    thread.start()
    assert reached.wait(60)
    assert newer.run_unit(token=3, lane=1).unit.micro_batch == 1
    assert other.run_unit(token=4, lane=0).unit.phase == "FB"  # merged onto lane 1's commit
    release.set()
    thread.join(60)
    assert len(refused) == 1 and "lane 1" in str(refused[0])
    on_disk = {p.name for p in root.joinpath("t").iterdir() if p.suffix == ".bin"}
    assert on_disk == {f"{name}@{version}.bin" for name, version in other.store.buffers.items()}  # none stale
    run = run_wavefront(root, "t", 2, first_token=5)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    session.export(root / "final")
    assert figures(run.results)[0] == one[0]  # step 0 ends with micro-batch 1's backward, in this run
    assert_bit_identical(exported_weights(root / "final"), exported_weights(one[2]))


def test_a_checkpoint_taken_mid_wavefront_resumes_bit_for_bit(tokens_path: Path, tmp_path: Path) -> None:
    """A checkpoint of a commit with units of later micro-batches done ahead of the first, restored after the
    host lost its store, trains on (here on one device) to the weights of an uninterrupted run."""
    spec = tiny_spec(tokens_path, micro_batches=2, steps=3, eval_every=0)
    one = trained(spec, tmp_path / "one", [0, 2, 4], devices=1)
    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=spec, spill_dir=spill, trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    for token, lane in enumerate([0, 1, 0, 1], start=1):  # F0 and F1 of both micro-batches of step 0
        session.run_unit(token=token, lane=lane)
    assert session.state.ahead, "units of micro-batch 1 are committed beyond the cursor"
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="t") is not None
    session.close()
    for path in (spill / "t").iterdir():  # the host lost its memory tier
        path.unlink()
    (spill / "t").rmdir()
    assert restore_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, trial_id="t") is not None
    restored = TrialSession.open(spill_dir=spill, trial_id="t", device=CPU)
    results = run_all(restored)
    restored.export(tmp_path / "final")
    assert figures(results)[0] == one[0]
    assert_bit_identical(exported_weights(tmp_path / "final"), exported_weights(one[2]))


def test_a_micro_batch_draws_from_its_own_seed(tokens_path: Path, tmp_path: Path) -> None:
    """Dropout masks of micro-batch 1 do not depend on micro-batch 0's forward having run: the same unit of
    micro-batch 1 run first or second gives the same boundary."""
    spec = tiny_spec(tokens_path, micro_batches=2, steps=1, eval_every=0)
    outputs = []
    for order in ([0, 1], [0, 0, 1]):
        root = tmp_path / "-".join(map(str, order))
        trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0, 2, 4])
        session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
        for token, lane in enumerate(order, start=1):
            session.run_unit(token=token, lane=lane)
        outputs.append(np.fromfile(session.store.path("a1.0"), dtype=np.float32))
    assert np.array_equal(*outputs)
    assert spec.model.dropout > 0


def test_a_replan_mid_wavefront_rolls_every_lane_back_and_stays_exact(tokens_path: Path, tmp_path: Path) -> None:
    """A unit of micro-batch 0 ran out of memory while micro-batch 1 had units committed ahead: the re-plan rolls
    the whole step back (the units ahead count as not run) and the trial ends as one device trains it."""
    spec = tiny_spec(tokens_path, micro_batches=2, steps=2, eval_every=0)
    one = trained(spec, tmp_path / "one", [0, 2, 4], devices=1)
    root = tmp_path / "many"
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    for token, lane in enumerate([0, 1, 0, 1], start=1):
        session.run_unit(token=token, lane=lane)
    assert session.state.ahead
    repartition(spill_dir=root, trial_id="t", device=CPU, cuts=[0, 1, 3, 5], token=10)
    replanned = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    assert (replanned.state.cursor, replanned.state.ahead, replanned.ready_lanes()) == (0, [], [0])
    replanned.close()
    run = run_wavefront(root, "t", 2, first_token=11)
    TrialSession.open(spill_dir=root, trial_id="t", device=CPU).export(root / "final")
    assert figures(run.results)[0] == one[0]
    assert_bit_identical(exported_weights(root / "final"), exported_weights(one[2]))


@pytest.mark.parametrize("order", [(2, 3, 0, 1), (0, 1, 2, 3)], ids=["parked", "in-order"])
def test_a_replan_before_a_one_shard_step_s_update_stays_exact(order: tuple[int, ...], tokens_path: Path,
                                                              tmp_path: Path) -> None:
    """Every micro-batch of a step of one shard committed, its S unit not run, the trial re-planned into 3 shards:
    with gradients still parked the step runs again whole; with the step summed, its update is applied and the
    next step starts. Either way the trial ends as one device trains it."""
    spec = tiny_spec(tokens_path, micro_batches=4, steps=2, eval_every=0)
    one = trained(spec, tmp_path / "one", [0], devices=1)
    root = tmp_path / "many"
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0])
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    for token, lane in enumerate(order, start=1):
        session.run_unit(token=token, lane=lane)
    assert session.timetable[session.state.cursor].phase == "S"
    parked = bool(session.state.step_state.parked)
    assert parked == (order[0] != 0)
    session.close()
    repartition(spill_dir=root, trial_id="t", device=CPU, cuts=[0, 2, 4], token=10)
    replanned = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    assert replanned.state.cursor == replanned.timetable.step_offset(0 if parked else 1)
    assert not [name for name in replanned.store.buffers if name.startswith("h")]
    replanned.close()
    run = run_wavefront(root, "t", 2, first_token=11)
    TrialSession.open(spill_dir=root, trial_id="t", device=CPU).export(root / "final")
    assert figures(run.results)[0] == (one[0] if parked else one[0][1:])
    assert_bit_identical(exported_weights(root / "final"), exported_weights(one[2]))
