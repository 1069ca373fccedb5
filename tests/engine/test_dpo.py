"""DPO on preference pairs trains in shards, spilled, exactly like a plain PyTorch DPO loop on the same row pairs:
full training against its starting weights (their log-probabilities computed first, in the reference pass) and
LoRA against the shared base with its adapters off, packed and not, in 2 micro-batches, with DPO's and IPO's loss.

The pairs are token ids drawn at random: a prompt of 2 to 9 tokens shared by a chosen and a rejected answer of 1
to 12 tokens each (every seventh pair's rejected answer 31, too long for a row), in rows of 32 (the pairs
module's own tests cover how conversations become such pairs).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all
from tests.engine.test_examples_training import save_base
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_dpo_training
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import LAST_ANSWER, PROMPT
from worker.engine.config import ContinuationSpec, DpoSpec, LoraSpec
from worker.engine.durable import checkpoint, continue_from_checkpoint
from worker.engine.examples import ExampleSet
from worker.engine.lora import ADAPTER_DIR
from worker.engine.pairs import PairRows, save_pairs
from worker.engine.repartition import repartition
from worker.engine.session import UnitResult

N_PAIRS, N_TRAIN = 30, 24


def random_pairs(n: int, seed: int) -> ExampleSet:
    """`n` pairs of random tokens: each a prompt and two answers, every seventh too long for a row of SEQ tokens."""
    rng = np.random.default_rng(seed)
    sequences = []
    for k in range(n):
        prompt = rng.integers(1, VOCAB, int(rng.integers(2, 10)))
        for side in ("chosen", "rejected"):
            length = 31 if k % 7 == 6 and side == "rejected" else int(rng.integers(1, 13))
            answer = rng.integers(1, VOCAB, length)
            marks = np.full(len(prompt) + len(answer), LAST_ANSWER, dtype=np.uint8)
            marks[:len(prompt)] = PROMPT
            sequences.append((np.concatenate([prompt, answer]).astype(np.int32), marks))
    return ExampleSet.from_examples(sequences)


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pairs")
    save_pairs(random_pairs(N_PAIRS, seed=11), directory)
    return directory


def dpo_spec(pairs_dir: Path, *, packing: bool = False, loss_type: str = "sigmoid", **overrides: object) -> TrialSpec:
    spec = TrialSpec(
        model=ModelSpec(family="llama", n_layer=3, n_embd=32, n_head=4, n_kv_head=2, vocab_size=VOCAB,
                        n_positions=SEQ, dropout=0.1),
        data=DataSpec(examples_dir=str(pairs_dir), train_examples=N_TRAIN, seq_len=SEQ, packing=packing,
                      pairs=True),
        optimizer=OptimizerSpec(kind="adamw", lr=3e-3, weight_decay=0.1, clip_norm=0.5),
        schedule=ScheduleSpec(warmup_steps=2, decay="cosine"),
        batch_size=8, micro_batches=2, steps=6, eval_every=3, eval_batches=2, seed=3,
        dpo=DpoSpec(beta=0.2, loss_type=loss_type),  # type: ignore[arg-type]
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def train_in_shards(spec: TrialSpec, root: Path, cuts: list[int], **create: object) -> tuple[list[UnitResult], Path]:
    trial_create(spec=spec, spill_dir=root / "spill", trial_id="t", device=CPU, cuts=cuts, **create)  # type: ignore[arg-type]
    session = TrialSession.open(spill_dir=root / "spill", trial_id="t", device=CPU)
    results = run_all(session)
    session.export(root / "final")
    return results, root / "final"


def steps(results: list[UnitResult]) -> list[UnitResult]:
    return [r for r in results if r.loss is not None]


def evaluations(results: list[UnitResult]) -> list[UnitResult]:
    return [r for r in results if r.eval_loss is not None]


@pytest.mark.parametrize(("packing", "loss_type"), [(False, "sigmoid"), (True, "ipo")])
def test_full_training_on_pairs_equals_a_plain_dpo_loop_against_a_frozen_copy(
    packing: bool, loss_type: str, pairs_dir: Path, tmp_path: Path
) -> None:
    spec = dpo_spec(pairs_dir, packing=packing, loss_type=loss_type)
    plain = plain_dpo_training(initial_weights(spec, tmp_path / "reference"), spec)

    results, final = train_in_shards(spec, tmp_path, cuts=[0, 1, 2, 3, 4])

    assert [r.unit.phase for r in results[:5]] == ["R"] * 5  # the reference pass opens the timetable
    assert [r.loss for r in steps(results)] == plain.losses
    assert [(r.rewards_chosen, r.rewards_rejected, r.reward_accuracy) for r in steps(results)] == plain.rewards
    assert [r.eval_loss for r in evaluations(results)] == plain.eval_losses
    assert [(r.eval_rewards_chosen, r.eval_rewards_rejected, r.eval_reward_accuracy)
            for r in evaluations(results)] == plain.eval_rewards
    assert_bit_identical(exported_weights(final), plain.weights)


@pytest.mark.parametrize(("packing", "loss_type"), [(True, "sigmoid"), (False, "ipo")])
def test_lora_on_pairs_equals_a_plain_dpo_loop_against_peft_with_its_adapter_disabled(
    packing: bool, loss_type: str, pairs_dir: Path, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base", "llama")
    spec = dpo_spec(pairs_dir, packing=packing, loss_type=loss_type, model=ModelSpec(pretrained_dir=str(base)),
                    lora=LoraSpec(r=4, alpha=8.0, dropout=0.1, target_modules=("q_proj", "v_proj")))
    plain = plain_dpo_training(initial_weights(spec, tmp_path / "reference"), spec)

    results, final = train_in_shards(spec, tmp_path, cuts=[0, 1, 2, 3])

    assert "R" not in {r.unit.phase for r in results}  # the base is the reference: nothing to compute first
    assert [r.loss for r in steps(results)] == plain.losses
    assert [(r.rewards_chosen, r.rewards_rejected, r.reward_accuracy) for r in steps(results)] == plain.rewards
    assert [r.eval_loss for r in evaluations(results)] == plain.eval_losses
    assert_bit_identical(load_file(final / ADAPTER_DIR / "adapter_model.safetensors"), plain.weights)


def test_the_first_step_starts_from_the_reference(pairs_dir: Path, tmp_path: Path) -> None:
    """Before any update the policy is its reference (without dropout, which the reference never has): every
    pair's DPO loss is log 2 and no answer has a reward, though the reference pass saw the pairs in other rows."""
    spec = dpo_spec(pairs_dir, steps=1, eval_every=0, packing=True)
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, dropout=0.0))
    results, _ = train_in_shards(spec, tmp_path, cuts=[0, 2])
    (first,) = steps(results)
    assert first.loss == pytest.approx(math.log(2), abs=1e-6)
    assert first.rewards_chosen == pytest.approx(0.0, abs=1e-6)
    assert first.rewards_rejected == pytest.approx(0.0, abs=1e-6)


def test_a_head_in_token_chunks_gives_the_plain_loops_numbers(pairs_dir: Path, tmp_path: Path) -> None:
    """The answers' log-probabilities from a head computed 16 tokens at a time (its tied weight's gradient streamed
    to the store) are those of whole logits: the trial is still the plain loop's, bit for bit."""
    spec = dpo_spec(pairs_dir, packing=True)
    plain = plain_dpo_training(initial_weights(spec, tmp_path / "reference"), spec)

    results, final = train_in_shards(spec, tmp_path, cuts=[0, 2, 4], head_token_chunk=16)

    assert TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU).plan.head_token_chunk == 16
    assert [r.loss for r in steps(results)] == plain.losses
    assert [r.eval_loss for r in evaluations(results)] == plain.eval_losses
    assert_bit_identical(exported_weights(final), plain.weights)


def test_the_loss_is_the_mean_over_the_batchs_pairs_however_it_is_cut_into_micro_batches(
    pairs_dir: Path, tmp_path: Path
) -> None:
    """Packed micro-batches of one batch hold different numbers of pairs; each divides its summed pair losses by
    the batch's pairs, so 1, 2 and 4 micro-batches train the same model (up to the order of float sums; without
    dropout, whose masks follow the micro-batches' shapes). Evaluations read the same rows in micro-batches too,
    as the web app plans them."""
    runs = {}
    for micro_batches in (1, 2, 4):
        spec = dpo_spec(pairs_dir, packing=True, micro_batches=micro_batches, eval_batches=2 * micro_batches)
        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, dropout=0.0))
        runs[micro_batches] = train_in_shards(spec, tmp_path / str(micro_batches), cuts=[0, 2])
    rows = PairRows.of(dpo_spec(pairs_dir, packing=True).data, vocab_size=VOCAB)
    batch = rows.train_batch(seed=3, step=0, batch_size=8)
    counts = [batch.micro_batch(4, i, CPU).count for i in range(4)]
    assert len(set(counts)) > 1, f"the test needs micro-batches of unequal pairs, got {counts}"

    (one, one_final), (two, two_final), (four, four_final) = runs[1], runs[2], runs[4]
    for other, other_final in ((two, two_final), (four, four_final)):
        assert [r.loss for r in steps(other)] == pytest.approx([r.loss for r in steps(one)], rel=1e-6)
        assert [r.eval_loss for r in evaluations(other)] == pytest.approx(
            [r.eval_loss for r in evaluations(one)], rel=1e-6)
        expected = exported_weights(one_final)
        for name, tensor in exported_weights(other_final).items():
            assert torch.allclose(tensor, expected[name], rtol=0, atol=1e-6), name


def test_a_replan_in_the_reference_pass_or_in_a_step_and_a_continuation_keep_the_numbers(
    pairs_dir: Path, tmp_path: Path
) -> None:
    """Re-planned during its reference pass and during a step, checkpointed as it ends and continued two steps, a
    full fine-tune gives the numbers of one trial trained in one go: the stored reference log-probabilities
    survive re-packing and the checkpoint, and the timetable after them is the same."""
    first = dpo_spec(pairs_dir, packing=True, steps=4, eval_every=2)
    spec = dataclasses.replace(first, continuations=(ContinuationSpec(after=4, steps=2, lr=1e-3),))
    whole, whole_final = train_in_shards(spec, tmp_path / "whole", cuts=[0, 1, 2, 3, 4])

    spill, disk = tmp_path / "spill", tmp_path / "checkpoints"
    trial_create(spec=first, spill_dir=spill, trial_id="ended", device=CPU, cuts=[0, 1, 2, 3, 4])
    session = TrialSession.open(spill_dir=spill, trial_id="ended", device=CPU)
    reference_units = session.state.reference_batches * 5
    assert reference_units > 5
    results = [session.run_unit() for _ in range(7)]  # into the second reference batch
    repartition(spill_dir=spill, trial_id="ended", device=CPU, cuts=[0, 2, 4], token=1)
    while session.next_unit().phase == "R" or session.next_unit().step == 0:
        results.append(session.run_unit())
    results += [session.run_unit() for _ in range(4)]  # into step 1
    repartition(spill_dir=spill, trial_id="ended", device=CPU, cuts=[0, 1, 2, 3, 4], token=2)
    results += run_all(session)
    session.close()
    assert checkpoint(spill_dir=spill, checkpoint_dir=disk, trial_id="ended") is not None
    shutil.rmtree(spill / "ended")
    continue_from_checkpoint(checkpoint_dir=disk, spill_dir=spill, source_id="ended", trial_id="more", spec=spec)
    again = TrialSession.open(spill_dir=spill, trial_id="more", device=CPU)
    assert again.next_unit().phase == "F" and again.next_unit().step == 4
    results += run_all(again)
    again.export(tmp_path / "final")

    assert [r.loss for r in steps(results)] == [r.loss for r in steps(whole)]
    assert [r.rewards_chosen for r in steps(results)] == [r.rewards_chosen for r in steps(whole)]
    assert [r.eval_loss for r in evaluations(results)] == [r.eval_loss for r in evaluations(whole)]
    assert_bit_identical(exported_weights(tmp_path / "final"), exported_weights(whole_final))
