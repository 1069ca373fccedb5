"""Examples laid out into rows: hand-computed rows, labels and positions, packed and not, and the seeded order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from worker.engine.chat import ANSWER, LAST_ANSWER, PROMPT
from worker.engine.errors import SpecError
from worker.engine.examples import IGNORE, ExampleRows, ExampleSet, pack

P, A, L = PROMPT, ANSWER, LAST_ANSWER


def example_set() -> ExampleSet:
    """Five examples of 3, 2, 4, 6 and 2 tokens; ids are 10 * example + position, so every token is traceable."""
    examples = [
        ([10, 11, 12], [P, P, L]),
        ([20, 21], [P, L]),
        ([30, 31, 32, 33], [P, A, P, L]),
        ([40, 41, 42, 43, 44, 45], [P, P, P, P, P, L]),
        ([50, 51], [P, L]),
    ]
    return ExampleSet.from_examples([(np.array(i, np.int32), np.array(m, np.uint8)) for i, m in examples])


def test_it_saves_and_loads_an_example_set(tmp_path: Path) -> None:
    examples = example_set()
    examples.save(tmp_path)
    loaded = ExampleSet.load(tmp_path)
    assert loaded.starts.tolist() == [0, 3, 5, 9, 15, 17]
    assert loaded.ids.tolist() == examples.ids.tolist()
    assert loaded.marks.tolist() == examples.marks.tolist()


def test_a_set_whose_arrays_disagree_is_refused(tmp_path: Path) -> None:
    example_set().save(tmp_path)
    np.save(tmp_path / "starts.npy", np.array([0, 3, 20], dtype=np.int64))
    with pytest.raises(SpecError, match="do not describe one example set"):
        ExampleSet.load(tmp_path)


def test_packing_puts_each_example_in_the_first_row_it_fits_and_starts_a_row_when_none_has_room() -> None:
    lengths = np.array([3, 2, 4, 6, 2])
    assert pack(lengths, np.array([0, 1, 2, 3, 4]), 6) == [(0, 1), (2, 4), (3,)]
    assert pack(lengths, np.array([4, 0, 1, 2, 3]), 7) == [(4, 0, 1), (2,), (3,)]


def test_a_packed_row_restarts_positions_and_never_labels_an_examples_first_token() -> None:
    rows = ExampleRows(example_set(), n_train=4, seq_len=6, packing=True, loss_on="all")
    batch = rows.row_tensors([(0, 1)])
    assert batch.ids.tolist() == [[10, 11, 12, 20, 21, 0]]
    assert batch.labels.tolist() == [[IGNORE, 11, 12, IGNORE, 21, IGNORE]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]


@pytest.mark.parametrize(("loss_on", "labels"), [
    ("assistant", [IGNORE, 31, IGNORE, 33, IGNORE, IGNORE]),
    ("last", [IGNORE, IGNORE, IGNORE, 33, IGNORE, IGNORE]),
    ("all", [IGNORE, 31, 32, 33, IGNORE, IGNORE]),
])
def test_loss_on_decides_the_labels(loss_on: str, labels: list[int]) -> None:
    rows = ExampleRows(example_set(), n_train=4, seq_len=6, packing=False, loss_on=loss_on)
    batch = rows.row_tensors([(2,)])
    assert batch.ids.tolist() == [[30, 31, 32, 33, 0, 0]]
    assert batch.labels.tolist() == [labels]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5]]


def test_examples_longer_than_the_sequence_are_dropped_and_counted_per_split() -> None:
    rows = ExampleRows(example_set(), n_train=4, seq_len=4, packing=False, loss_on="assistant")
    assert rows.train_examples.tolist() == [0, 1, 2]
    assert rows.val_examples.tolist() == [4]
    assert rows.dropped == (1, 0)
    with pytest.raises(SpecError, match="no training example fits a sequence of 1 tokens"):
        ExampleRows(example_set(), n_train=4, seq_len=1, packing=False, loss_on="assistant")


def test_training_rows_walk_seeded_epochs_and_a_step_may_span_two() -> None:
    rows = ExampleRows(example_set(), n_train=4, seq_len=6, packing=False, loss_on="assistant")
    epochs = [[int(k) for k in rows.train_examples[np.random.default_rng([7, e]).permutation(4)]] for e in range(3)]
    steps = [rows.train_rows(seed=7, step=s, batch_size=3) for s in range(3)]
    assert [k for step in steps for (k,) in step] == epochs[0] + epochs[1] + epochs[2][:1]
    # a fresh view, asked for a late step first, gives the same rows (no state between calls)
    fresh = ExampleRows(example_set(), n_train=4, seq_len=6, packing=False, loss_on="assistant")
    assert fresh.train_rows(seed=7, step=2, batch_size=3) == steps[2]


def test_packing_uses_fewer_rows_for_the_same_examples_and_reports_its_efficiency() -> None:
    unpacked = ExampleRows(example_set(), n_train=4, seq_len=6, packing=False, loss_on="assistant")
    packed = ExampleRows(example_set(), n_train=4, seq_len=6, packing=True, loss_on="assistant")
    plain_rows = unpacked.epoch_rows(seed=0, epoch=0)
    packed_rows = packed.epoch_rows(seed=0, epoch=0)
    assert sorted(k for row in packed_rows for k in row) == [0, 1, 2, 3]
    assert len(packed_rows) < len(plain_rows)
    assert unpacked.efficiency(plain_rows) == pytest.approx(15 / 24)
    assert packed.efficiency(packed_rows) == pytest.approx(15 / (6 * len(packed_rows)))


def test_an_evaluation_counts_the_bytes_of_the_tokens_its_loss_covers(tmp_path: Path) -> None:
    byte_lengths = np.arange(64) % 4  # id 10 -> 2 bytes, 11 -> 3, 12 -> 0, ...
    base = example_set()
    examples = ExampleSet.from_examples(
        [(base.ids[b:e], base.marks[b:e]) for b, e in zip(base.starts[:-1], base.starts[1:], strict=True)],
        byte_lengths)
    examples.save(tmp_path)
    loaded = ExampleSet.load(tmp_path)
    assert loaded.token_bytes is not None and loaded.token_bytes.tolist() == (base.ids % 4).tolist()
    rows = ExampleRows(loaded, n_train=3, seq_len=6, packing=True, loss_on="assistant")
    assert rows.val_rows == [(3,), (4,)]
    # example 3 labels its last token only (45: 1 byte); example 4 its last (51: 3 bytes)
    assert rows.eval_bytes(batch=0, batch_size=2) == 1 + 3
    assert rows.eval_bytes(batch=1, batch_size=1) == 3
    # evaluations score the answers whatever a trial trains on, so trials of a loss_on sweep compare
    everything = ExampleRows(loaded, n_train=3, seq_len=6, packing=True, loss_on="all")
    assert everything.eval_bytes(batch=0, batch_size=1) == 1
    assert everything.eval_batch(batch=0, batch_size=1).labels.tolist() == [[IGNORE] * 5 + [45]]
    assert everything.train_batch(seed=0, step=0, batch_size=3).labels.ne(IGNORE).sum() > 3
