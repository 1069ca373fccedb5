"""Instruction and chat examples train in shards, spilled, exactly like plain PyTorch on the same rows and labels
(-100 on every token the loss skips), for full and LoRA training of the rotary families; packing changes which
examples share a row, not any example's loss.

The examples are token ids drawn at random with prompt and answer marks (the chat module's own tests cover how
conversations become such marks), of lengths spread from 3 to 24 tokens in rows of 32.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.engine.conftest import CPU, SEQ, VOCAB, run_all
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_training
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import ANSWER, LAST_ANSWER, PROMPT
from worker.engine.config import LoraSpec
from worker.engine.errors import SpecError
from worker.engine.examples import IGNORE, ExampleRows, ExampleSet
from worker.engine.lora import ADAPTER_DIR

N_EXAMPLES, N_TRAIN = 40, 32


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    examples = []
    for _ in range(N_EXAMPLES):
        length = int(rng.integers(3, 25))
        prompt = int(rng.integers(1, length - 1))
        marks = np.full(length, LAST_ANSWER, dtype=np.uint8)
        marks[:prompt] = PROMPT
        if length - prompt > 3:  # an earlier answer turn, then the last one
            marks[prompt: prompt + 2] = ANSWER
            marks[prompt + 2] = PROMPT
        examples.append((rng.integers(1, VOCAB, length).astype(np.int32), marks))
    directory = tmp_path_factory.mktemp("examples")
    ExampleSet.from_examples(examples).save(directory)
    return directory


def example_spec(examples_dir: Path, **overrides: object) -> TrialSpec:
    data = dict(examples_dir=str(examples_dir), train_examples=N_TRAIN, seq_len=SEQ, packing=False,
                loss_on="assistant")
    data.update({k: overrides.pop(k) for k in ("packing", "loss_on") if k in overrides})
    spec = TrialSpec(
        model=ModelSpec(family="llama", n_layer=3, n_embd=32, n_head=4, n_kv_head=2, vocab_size=VOCAB,
                        n_positions=SEQ, dropout=0.1),
        data=DataSpec(**data),  # type: ignore[arg-type]
        optimizer=OptimizerSpec(kind="adamw", lr=3e-3, weight_decay=0.1, clip_norm=0.5),
        schedule=ScheduleSpec(warmup_steps=2, decay="cosine"),
        batch_size=4, micro_batches=2, steps=8, eval_every=4, eval_batches=2, seed=3,
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def train_in_shards(spec: TrialSpec, root: Path, cuts: list[int]) -> tuple[list[float], list[float], Path]:
    trial_create(spec=spec, spill_dir=root / "spill", trial_id="t", device=CPU, cuts=cuts)
    session = TrialSession.open(spill_dir=root / "spill", trial_id="t", device=CPU)
    results = run_all(session)
    session.export(root / "final")
    return ([r.loss for r in results if r.loss is not None],
            [r.eval_loss for r in results if r.eval_loss is not None], root / "final")


@pytest.mark.parametrize(("family", "packing", "loss_on"), [
    ("llama", False, "assistant"),
    ("llama", True, "assistant"),
    ("qwen2", True, "last"),
    ("qwen2", False, "all"),
])
def test_masked_examples_train_in_shards_exactly_like_plain_pytorch(
    family: str, packing: bool, loss_on: str, examples_dir: Path, tmp_path: Path
) -> None:
    spec = example_spec(examples_dir, packing=packing, loss_on=loss_on)
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, family=family))
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)

    losses, eval_losses, final = train_in_shards(spec, tmp_path, cuts=[0, 1, 2, 3, 4])

    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(exported_weights(final), reference.weights)


def save_base(directory: Path, family: str, *, attention_dropout: float = 0.1) -> Path:
    """A tiny pretrained checkpoint of `family` (random weights, a fixed seed), as save_pretrained writes it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        shape = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=SEQ,
                     attention_dropout=attention_dropout)
        if family == "llama":
            LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True)).save_pretrained(directory)
        else:
            Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False)).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_masked_packed_examples_train_lora_in_shards_exactly_like_peft(
    family: str, examples_dir: Path, tmp_path: Path
) -> None:
    base = save_base(tmp_path / "base", family)
    spec = example_spec(examples_dir, packing=True, model=ModelSpec(pretrained_dir=str(base)),
                        lora=LoraSpec(r=4, alpha=8.0, dropout=0.1, target_modules=("q_proj", "v_proj")))
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)

    losses, eval_losses, final = train_in_shards(spec, tmp_path, cuts=[0, 1, 2, 3])

    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(load_file(final / ADAPTER_DIR / "adapter_model.safetensors"), reference.weights)


def per_example_losses(model: torch.nn.Module, rows: ExampleRows, layout: list[tuple[int, ...]]) -> dict[int, float]:
    """Each example's summed cross-entropy over its labelled tokens, from rows laid out as `layout`."""
    batch = rows.row_tensors(layout)
    with torch.no_grad():
        logits = model(batch.ids, position_ids=batch.position_ids, use_cache=False).logits  # (R, T, V)
    targets = torch.nn.functional.pad(batch.labels, (0, 1), value=IGNORE)[:, 1:]  # what each position predicts
    token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE,
                                                   reduction="none")  # (R, T)
    losses = {}
    lengths = rows.examples.lengths
    for r, row in enumerate(layout):
        at = 0
        for example in row:
            n = int(lengths[example])
            losses[example] = token_loss[r, at: at + n].sum().item()  # the prediction of the next example's
            at += n  # first token is not among them: that label is IGNORE
    return losses


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_packed_example_has_the_loss_it_has_alone_within_float_rounding(family: str, examples_dir: Path,
                                                                          tmp_path: Path) -> None:
    """Packed rows restart positions and keep attention inside each example, so an example's loss is the one
    it has alone in a padded row. Not bit for bit: attention then reduces over rows of other lengths (other
    masked keys), which reorders float sums; fp32 rounding bounds the difference (rtol 1e-5)."""
    model = AutoModelForCausalLM.from_pretrained(save_base(tmp_path / "base", family)).eval()
    examples = ExampleSet.load(examples_dir)
    packed = ExampleRows(examples, n_train=N_TRAIN, seq_len=SEQ, packing=True, loss_on="all")
    alone = ExampleRows(examples, n_train=N_TRAIN, seq_len=SEQ, packing=False, loss_on="all")
    packed_rows = packed.epoch_rows(seed=0, epoch=0)
    assert any(len(row) > 2 for row in packed_rows)

    packed_losses = per_example_losses(model, packed, packed_rows)
    alone_losses = per_example_losses(model, alone, [(k,) for row in packed_rows for k in row])

    assert packed_losses.keys() == alone_losses.keys() == set(range(N_TRAIN))
    for example, loss in alone_losses.items():
        assert packed_losses[example] == pytest.approx(loss, rel=1e-5), example
    # and packing is not a no-op: the same rows with positions counted across examples give other losses
    crossed = dataclasses.replace(packed.row_tensors(packed_rows), position_ids=None)
    with torch.no_grad():
        restarted = packed.row_tensors(packed_rows).position_ids
        assert not torch.allclose(model(crossed.ids, use_cache=False).logits,
                                  model(crossed.ids, position_ids=restarted, use_cache=False).logits)


def test_a_spec_names_token_blocks_or_examples_and_examples_hold_out_whole_examples(examples_dir: Path) -> None:
    with pytest.raises(SpecError, match="set one"):
        DataSpec(tokens_path="tokens.npy", examples_dir=str(examples_dir), train_examples=3)
    with pytest.raises(SpecError, match="whole examples"):
        DataSpec(examples_dir=str(examples_dir), train_examples=3, holdout_tokens=10, val_start=5)
    with pytest.raises(SpecError, match="loss_on 'everything'"):
        DataSpec(examples_dir=str(examples_dir), train_examples=3, loss_on="everything")  # type: ignore[arg-type]
    spec = example_spec(examples_dir)
    assert TrialSpec.from_dict(spec.to_dict()) == spec


def test_the_final_evaluation_covers_every_held_out_example_once_with_bits_per_byte_of_its_answers(
    examples_dir: Path, tmp_path: Path
) -> None:
    """The last evaluation reads each validation example that fits once (batches of 2 rows, the last one
    shorter) and reports the mean loss per labelled token and bits per byte of those tokens' text, as the
    exported model gives them in plain PyTorch."""
    examples = ExampleSet.load(examples_dir)
    with_bytes = tmp_path / "examples"
    byte_lengths = np.arange(VOCAB) % 3 + 1  # each id stands for 1-3 bytes of text
    pairs = [(examples.ids[b:e], examples.marks[b:e]) for b, e in zip(examples.starts[:-1], examples.starts[1:],
                                                                       strict=True)]
    ExampleSet.from_examples(pairs, byte_lengths).save(with_bytes)
    spec = example_spec(with_bytes, steps=4, eval_every=2)
    rows = ExampleRows.of(spec.data, vocab_size=VOCAB)
    held_out = len(rows.val_examples)
    assert held_out == N_EXAMPLES - N_TRAIN and held_out % spec.micro_batch_size == 0
    spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, holdout_rows=held_out - 1))
    with pytest.raises(SpecError, match="7 held-out rows were declared, but 8"):
        ExampleRows.of(spec.data, vocab_size=VOCAB)
    spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, holdout_rows=held_out))
    assert spec.final_eval_batches == held_out // spec.micro_batch_size

    trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    final = [r for r in run_all(session) if r.final_step is not None]
    session.export(tmp_path / "final")

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    batch = rows.row_tensors([(int(k),) for k in rows.val_examples])
    with torch.no_grad():
        logits = model(batch.ids, use_cache=False).logits
    targets = torch.nn.functional.pad(batch.labels, (0, 1), value=IGNORE)[:, 1:]
    summed = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE,
                                               reduction="sum").item()
    labelled = targets != IGNORE
    n_bytes = int(torch.from_numpy(byte_lengths)[targets[labelled]].sum())
    assert [r.final_step for r in final] == [4]
    assert final[0].eval_tokens == int(labelled.sum())
    assert final[0].eval_bytes == n_bytes
    assert final[0].eval_loss == pytest.approx(summed / int(labelled.sum()), rel=1e-5)
    assert final[0].eval_bpb == pytest.approx(summed / np.log(2) / n_bytes, rel=1e-5)
