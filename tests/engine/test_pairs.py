"""Preference pairs: their tokens and marks from the chat template, the checks a pair set passes before a trial
reads it, and the row pairs it is laid out in (a pair's sequences side by side in one micro-batch, never cut)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.engine.test_chat import CONVERSATION, END, START, WORDS, word_tokenizer
from tests.engine.test_dpo import N_PAIRS, N_TRAIN, dpo_spec, random_pairs
from worker.engine import DataSpec, TrialSpec
from worker.engine.chat import LAST_ANSWER, PROMPT, chat_tokenizer
from worker.engine.config import DpoSpec
from worker.engine.errors import SpecError
from worker.engine.examples import IGNORE, ExampleRows, ExampleSet
from worker.engine.pairs import PairError, PairRows, encode_pair, encode_pairs, load_pairs, pack_pairs, save_pairs

PROMPT_TURNS = CONVERSATION[1:2]  # user: hi
CHOSEN = [{"role": "assistant", "content": "hello"}]
REJECTED = [{"role": "assistant", "content": "bye ok"}]


def words(*names: str) -> list[int]:
    return [WORDS.index(name) for name in names]


def test_a_pair_is_its_prompt_rendered_once_and_each_answer_with_its_end_of_turn() -> None:
    tokenizer = chat_tokenizer(word_tokenizer())

    (chosen, chosen_marks), (rejected, rejected_marks) = encode_pair(tokenizer, PROMPT_TURNS, CHOSEN, REJECTED)

    prompt = [START, *words("user", "hi"), END, START, *words("assistant")]
    assert chosen.tolist() == [*prompt, *words("hello"), END]
    assert rejected.tolist() == [*prompt, *words("bye", "ok"), END]
    assert chosen_marks.tolist() == [PROMPT] * len(prompt) + [LAST_ANSWER] * 2
    assert rejected_marks.tolist() == [PROMPT] * len(prompt) + [LAST_ANSWER] * 3


def test_a_pair_whose_prompt_or_answer_renders_to_nothing_is_reported_with_its_line() -> None:
    bare = chat_tokenizer(word_tokenizer(), template="{% for m in messages %}{{ m['content'] }} {% endfor %}")
    empty = [{"role": "assistant", "content": ""}]
    rows = [(3, PROMPT_TURNS, CHOSEN, REJECTED), (4, PROMPT_TURNS, empty, REJECTED),
            (5, [{"role": "user", "content": ""}], CHOSEN, REJECTED)]

    encoded = encode_pairs(bare, rows)

    assert encoded.lines == [3]
    assert len(encoded.examples) == 2
    assert encoded.failed == [(4, "the chosen answer renders to no token"),
                              (5, "the prompt renders to no token of its own, so an answer's first token would be "
                                  "predicted from nothing")]
    with pytest.raises(PairError):
        encode_pair(bare, PROMPT_TURNS, CHOSEN, empty)


def test_a_pair_set_round_trips_and_bad_ones_are_refused_naming_the_pair(tmp_path: Path) -> None:
    pairs = random_pairs(4, seed=1)
    save_pairs(pairs, tmp_path / "good")
    assert load_pairs(tmp_path / "good").ids.tolist() == pairs.ids.tolist()

    def broken(name: str, edit: dict[str, np.ndarray]) -> Path:
        directory = tmp_path / name
        save_pairs(dataclasses.replace(pairs, **edit), directory)
        return directory

    ids = pairs.ids.copy()
    ids[int(pairs.starts[5]) + 1] += 1  # pair 2's rejected sequence: another prompt token than its chosen one
    with pytest.raises(SpecError, match="pair 2 has a chosen and a rejected sequence with different prompts"):
        load_pairs(broken("prompts", {"ids": ids}))
    marks = pairs.marks.copy()
    marks[int(pairs.starts[2]):int(pairs.starts[3])] = PROMPT  # pair 1's chosen sequence: no answer
    with pytest.raises(SpecError, match="pair 1 is not two sequences of one prompt followed by an answer"):
        load_pairs(broken("answer", {"marks": marks}))
    (tmp_path / "good" / "pairs.json").write_text(json.dumps({"pairs": 5}))
    with pytest.raises(SpecError, match="declares 5 pairs but holds 8 sequences"):
        load_pairs(tmp_path / "good")


def test_pairs_train_with_dpo_and_examples_without_it(tmp_path: Path) -> None:
    pairs = random_pairs(6, seed=2)
    save_pairs(pairs, tmp_path / "pairs")
    pairs.save(tmp_path / "examples")  # the same sequences, as instruction examples
    with pytest.raises(SpecError, match="holds preference pairs: they train with DPO"):
        ExampleRows.of(DataSpec(examples_dir=str(tmp_path / "pairs"), train_examples=4), vocab_size=256)
    with pytest.raises(SpecError, match="holds no preference pairs"):
        PairRows.of(DataSpec(examples_dir=str(tmp_path / "examples"), train_examples=4, pairs=True), vocab_size=256)


def test_a_dpo_spec_is_checked_and_keeps_its_form() -> None:
    spec = dpo_spec(Path("pairs"))
    assert TrialSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.to_dict()["dpo"] == {"beta": 0.2, "loss_type": "sigmoid"}
    plain = dataclasses.replace(spec, dpo=None, data=dataclasses.replace(spec.data, pairs=False))
    assert "dpo" not in plain.to_dict() and "pairs" not in plain.to_dict()["data"]  # the form it always had
    with pytest.raises(SpecError, match=r"set both dpo and data\.pairs, or neither"):
        dataclasses.replace(spec, dpo=None)
    with pytest.raises(SpecError, match=r"set both dpo and data\.pairs, or neither"):
        dataclasses.replace(spec, data=dataclasses.replace(spec.data, pairs=False))
    with pytest.raises(SpecError, match="6 in 2 micro-batches gives 3 rows, an odd number"):
        dataclasses.replace(spec, batch_size=6)
    with pytest.raises(SpecError, match="loss_on must stay 'assistant', got 'all'"):
        dataclasses.replace(spec.data, loss_on="all")
    for beta in (0, -1.0, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(SpecError, match="beta must be a positive number"):
            DpoSpec(beta=beta)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="loss_type 'hinge' is not one of sigmoid, ipo"):
        DpoSpec(loss_type="hinge")  # type: ignore[arg-type]


def test_pairs_pack_first_fit_with_each_sequence_in_its_own_row() -> None:
    lengths = np.array([[10, 20], [20, 10], [12, 8], [5, 5]])  # (chosen, rejected) tokens
    assert pack_pairs(lengths, np.arange(4), 32) == [(0, 1), (2, 3)]
    # Pair 0 would fit the first row pair's upper row (15 free) but not its lower one (19 free): the second's.
    assert pack_pairs(lengths, np.array([3, 2, 1, 0]), 32) == [(3, 2), (1, 0)]


@pytest.mark.parametrize("packing", [False, True])
def test_row_pairs_hold_whole_pairs_side_by_side_and_micro_batches_hold_whole_row_pairs(
    packing: bool, tmp_path: Path
) -> None:
    save_pairs(random_pairs(N_PAIRS, seed=11), tmp_path)
    spec = dpo_spec(tmp_path, packing=packing)
    rows = PairRows.of(spec.data, vocab_size=256)
    examples = rows.examples
    too_long = (examples.lengths.reshape(-1, 2) > spec.data.seq_len).any(1)
    assert rows.dropped == (int(too_long[:N_TRAIN].sum()), int(too_long[N_TRAIN:].sum()))
    assert rows.dropped[0] > 0  # the fixture has pairs too long for a row, which are left out, not cut

    batch = rows.train_batch(seed=3, step=0, batch_size=spec.batch_size)
    assert batch.ids.shape == (spec.batch_size, spec.data.seq_len)
    seen = []
    for index in range(spec.micro_batches):
        part = batch.micro_batch(spec.micro_batches, index, torch.device("cpu"))
        assert part.pairs == batch.pairs
        for q, key in enumerate(part.keys.tolist()):
            pair = int(rows.reference_order[key])
            seen.append(pair)
            rows_of_pair = []
            for side in (0, 1):
                where = (part.sequences == 2 * q + side).nonzero()
                row = int(where[0, 0])
                assert set(where[:, 0].tolist()) == {row}  # in one row, never cut
                rows_of_pair.append(row)
                begin, end = int(examples.starts[2 * pair + side]), int(examples.starts[2 * pair + side + 1])
                assert part.ids[row, where[:, 1]].tolist() == examples.ids[begin:end].tolist()
                answer = examples.marks[begin:end] != PROMPT
                assert (part.labels[row, where[:, 1]] != IGNORE).tolist() == answer.tolist()
            assert rows_of_pair[0] % 2 == 0 and rows_of_pair[1] == rows_of_pair[0] + 1  # chosen above rejected
    assert len(seen) == batch.pairs == len(set(seen))
    if packing:
        assert batch.pairs > spec.batch_size // 2
    else:
        assert batch.pairs == spec.batch_size // 2


def test_the_reference_order_is_every_kept_training_pair_then_every_kept_validation_pair(tmp_path: Path) -> None:
    save_pairs(random_pairs(N_PAIRS, seed=11), tmp_path)
    rows = PairRows.of(dpo_spec(tmp_path).data, vocab_size=256)
    assert rows.reference_order.tolist() == [*rows.train_examples.tolist(), *rows.val_examples.tolist()]
    size = 4
    batches = [rows.reference_batch(batch=b, batch_size=size) for b in range(rows.reference_batches(size))]
    assert torch.cat([b.keys for b in batches]).tolist() == list(range(len(rows.reference_order)))
    assert all(b.count == size // 2 for b in batches[:-1]) and 0 < batches[-1].count <= size // 2


def test_a_declared_held_out_set_counts_two_rows_a_pair(tmp_path: Path) -> None:
    save_pairs(random_pairs(N_PAIRS, seed=11), tmp_path)
    spec = dpo_spec(tmp_path)
    held_out = len(PairRows.of(spec.data, vocab_size=256).val_examples)
    with pytest.raises(SpecError, match=f"{held_out} validation pairs fit a sequence of 32 tokens, in "
                                        f"{2 * held_out} rows"):
        PairRows.of(dataclasses.replace(spec.data, holdout_rows=held_out), vocab_size=256)
    spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, holdout_rows=2 * held_out))
    assert spec.final_eval_batches == -(-2 * held_out // spec.micro_batch_size)
    ExampleSet.load(tmp_path)  # the arrays themselves are an ordinary example set
