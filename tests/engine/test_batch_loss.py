"""A step's loss is the mean token loss of its whole batch, however the batch is cut into micro-batches.

Chat examples have answers of different lengths, so the micro-batches of one batch cover different numbers of
trained tokens. Each micro-batch's summed token loss is divided by the tokens of the whole batch (transformers'
``num_items_in_batch``, TRL's SFT loss), never averaged per micro-batch and then over micro-batches: the loss,
the gradients and the trained weights then do not depend on ``micro_batches``, a number the planner and the
memory budget may choose. Cut differently, the same sums are added in another order, so the figures agree to
float rounding, not bit for bit: losses to a relative 1e-6 and weights trained for 6 steps to an absolute 1e-6
(the averaging that weighted each micro-batch alike moves them by more than 1e-4).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all
from tests.engine.test_examples_training import save_base
from tests.plain_pytorch import exported_weights
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import LAST_ANSWER, PROMPT
from worker.engine.config import LoraSpec
from worker.engine.data import train_batch, trial_data
from worker.engine.examples import ExampleSet, predicted_tokens
from worker.engine.lora import ADAPTER_DIR

N_EXAMPLES, N_TRAIN = 36, 32
LOSS_RTOL = 1e-6
WEIGHT_ATOL = 1e-6


@pytest.fixture(scope="module")
def uneven_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conversations whose answers run from 1 to 20 tokens after prompts of 2 to 8."""
    rng = np.random.default_rng(11)
    examples = []
    for _ in range(N_EXAMPLES):
        prompt, answer = int(rng.integers(2, 9)), int(rng.integers(1, 21))
        marks = np.concatenate([np.full(prompt, PROMPT), np.full(answer, LAST_ANSWER)]).astype(np.uint8)
        examples.append((rng.integers(1, VOCAB, prompt + answer).astype(np.int32), marks))
    directory = tmp_path_factory.mktemp("uneven")
    ExampleSet.from_examples(examples).save(directory)
    return directory


def uneven_spec(examples_dir: Path, *, packing: bool, micro_batches: int, lora_base: Path | None) -> TrialSpec:
    """Dropout off: micro-batches of another size draw other dropout masks, which is not what is compared."""
    model = (ModelSpec(pretrained_dir=str(lora_base)) if lora_base is not None else
             ModelSpec(family="llama", n_layer=3, n_embd=32, n_head=4, n_kv_head=2, vocab_size=VOCAB,
                       n_positions=SEQ, dropout=0.0))
    return TrialSpec(
        model=model,
        data=DataSpec(examples_dir=str(examples_dir), train_examples=N_TRAIN, seq_len=SEQ, packing=packing,
                      loss_on="assistant"),
        optimizer=OptimizerSpec(kind="adamw", lr=3e-3, weight_decay=0.1, clip_norm=1.0),
        schedule=ScheduleSpec(warmup_steps=1, decay="cosine"),
        lora=None if lora_base is None else LoraSpec(r=4, alpha=8.0, dropout=0.0, target_modules=("q_proj", "v_proj")),
        # an evaluation of one batch's rows, however many micro-batches read them (as the web app plans them)
        batch_size=4, micro_batches=micro_batches, steps=6, eval_every=3, eval_batches=micro_batches, seed=5,
    )


def train(spec: TrialSpec, root: Path) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    trial_create(spec=spec, spill_dir=root / "spill", trial_id="t", device=CPU, cuts=[0, 2, 3])
    session = TrialSession.open(spill_dir=root / "spill", trial_id="t", device=CPU)
    results = run_all(session)
    session.export(root / "final")
    if spec.lora is not None:
        weights = load_file(root / "final" / ADAPTER_DIR / "adapter_model.safetensors")
    else:
        weights = exported_weights(root / "final")
    return ([r.loss for r in results if r.loss is not None], [r.eval_loss for r in results if r.eval_loss is not None],
            weights)


@pytest.mark.parametrize(("packing", "lora"), [(False, False), (True, False), (False, True), (True, True)])
def test_it_trains_the_same_at_one_two_and_four_micro_batches(
    packing: bool, lora: bool, uneven_examples: Path, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base", "llama", attention_dropout=0.0) if lora else None
    specs = {m: uneven_spec(uneven_examples, packing=packing, micro_batches=m, lora_base=base) for m in (1, 2, 4)}
    # the micro-batches of a step do cover different numbers of trained tokens
    data = trial_data(specs[4].data, vocab_size=VOCAB)
    first = train_batch(data, seed=specs[4].seed, step=0, batch_size=4)
    counts = [predicted_tokens(first.micro_batch(4, m, CPU).labels) for m in range(4)]
    assert len(set(counts)) > 1 and sum(counts) == first.loss_tokens

    runs = {m: train(spec, tmp_path / f"mb{m}") for m, spec in specs.items()}

    losses, eval_losses, weights = runs[1]
    for m in (2, 4):
        assert runs[m][0] == pytest.approx(losses, rel=LOSS_RTOL)
        assert runs[m][1] == pytest.approx(eval_losses, rel=LOSS_RTOL)
        assert runs[m][2].keys() == weights.keys()
        for name, tensor in weights.items():
            torch.testing.assert_close(runs[m][2][name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=name)


def test_a_micro_batch_keeps_the_token_count_of_its_whole_batch(uneven_examples: Path) -> None:
    spec = uneven_spec(uneven_examples, packing=False, micro_batches=2, lora_base=None)
    batch = train_batch(trial_data(spec.data, vocab_size=VOCAB), seed=spec.seed, step=0, batch_size=4)
    halves = [batch.micro_batch(2, m, CPU) for m in range(2)]
    assert batch.loss_tokens == int((batch.labels[:, 1:] != -100).sum())
    assert [half.loss_tokens for half in halves] == [batch.loss_tokens] * 2
    assert sum(predicted_tokens(half.labels) for half in halves) == batch.loss_tokens


def test_a_batch_without_trained_tokens_has_a_zero_loss_not_nan(uneven_examples: Path, tmp_path: Path) -> None:
    """TRL's SFT loss divides by the trained tokens clamped to 1; a step of only prompts moves nothing but weight
    decay rather than poisoning the weights with NaN."""
    examples = ExampleSet.load(uneven_examples)
    prompts_only = ExampleSet(ids=examples.ids, marks=np.zeros_like(examples.marks), starts=examples.starts)
    prompts_only.save(tmp_path / "prompts")
    spec = dataclasses.replace(uneven_spec(tmp_path / "prompts", packing=False, micro_batches=2, lora_base=None),
                               steps=1, eval_every=0)
    losses, _, weights = train(spec, tmp_path)
    assert losses == [0.0]
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
