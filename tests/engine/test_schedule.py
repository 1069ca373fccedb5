"""Timetables against exact expected sequences; LR multipliers against transformers' definitions."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from worker.engine.config import ScheduleSpec
from worker.engine.schedule import Timetable, lr_factor


def codes(table: Timetable) -> list[str]:
    return [f"{u.step}{u.phase}{u.shard}/{u.micro_batch}" for u in table]


def test_it_lays_out_forward_backward_and_eval_units() -> None:
    table = Timetable(shards=3, steps=2, micro_batches=2, eval_every=2, eval_batches=1)
    step = "{s}F0/{m} {s}F1/{m} {s}FB2/{m} {s}B1/{m} {s}B0/{m}"
    expected = " ".join([
        step.format(s=0, m=0), step.format(s=0, m=1), step.format(s=1, m=0), step.format(s=1, m=1),
        "1E0/0 1E1/0 1E2/0",
    ]).split()
    assert codes(table) == expected
    assert [table[i] for i in range(len(table))] == list(table)


def test_it_evaluates_every_n_steps_and_after_the_last() -> None:
    table = Timetable(shards=1, steps=5, micro_batches=1, eval_every=2, eval_batches=2)
    assert codes(table) == [
        "0FB0/0", "1FB0/0", "1E0/0", "1E0/1", "2FB0/0", "3FB0/0", "3E0/0", "3E0/1", "4FB0/0", "4E0/0", "4E0/1",
    ]


def test_it_ends_with_step_units_without_a_final_eval() -> None:
    table = Timetable(shards=2, steps=1, micro_batches=1, eval_every=0, eval_batches=1)
    assert codes(table) == ["0F0/0", "0FB1/0", "0B0/0", "0S0/0", "0S1/0"]
    with pytest.raises(IndexError):
        table[len(table)]


def test_a_step_of_one_shard_ends_with_its_own_step_unit() -> None:
    """With step units, each step of one shard ends with an S unit (finishing the sum and applying the update):
    its micro-batches and its evaluation's batches need nothing of each other but the evaluation's last batch, and
    the trial needs no final updates of its own."""
    table = Timetable(shards=1, steps=3, micro_batches=2, eval_every=2, eval_batches=2, step_units=True)
    assert codes(table) == ["0FB0/0", "0FB0/1", "0S0/0", "1FB0/0", "1FB0/1", "1S0/0", "1E0/0", "1E0/1",
                            "2FB0/0", "2FB0/1", "2S0/0", "2E0/0", "2E0/1"]
    assert [table[i] for i in range(len(table))] == list(table)
    assert [table.step_offset(step) for step in range(4)] == [0, 3, 8, 13]
    step, update, evaluation = table.segment(4), table.segment(5), table.segment(7)
    assert (step.start, step.lanes, step.gathered, [step.needs(i) for i in (3, 4)]) == (3, 2, True, [[], []])
    assert (update.start, update.lanes, update.needs(5)) == (5, 1, [])
    assert (evaluation.start, [evaluation.needs(i) for i in (6, 7)]) == (6, [[], [6]])
    bare = Timetable(shards=1, steps=2, micro_batches=3, eval_every=0, eval_batches=1, step_units=True)
    assert codes(bare) == ["0FB0/0", "0FB0/1", "0FB0/2", "0S0/0", "1FB0/0", "1FB0/1", "1FB0/2", "1S0/0"]
    # A continued trial's timetable starts with the one it ended with; several shards have no step units.
    ended = Timetable(shards=1, steps=2, micro_batches=2, eval_every=0, eval_batches=1, step_units=True)
    continued = Timetable(shards=1, steps=3, micro_batches=2, eval_every=0, eval_batches=1, ends=(2,), step_units=True)
    assert codes(continued)[:len(ended)] == codes(ended) and continued.step_offset(2) == len(ended)
    assert codes(Timetable(shards=2, steps=1, micro_batches=1, eval_every=0, eval_batches=1, step_units=True)) == [
        "0F0/0", "0FB1/0", "0B0/0", "0S0/0", "0S1/0"]


@pytest.mark.parametrize(("decay", "make"), [
    ("constant", lambda opt, warmup, total: get_constant_schedule_with_warmup(opt, warmup)),
    ("linear", get_linear_schedule_with_warmup),
    ("cosine", get_cosine_schedule_with_warmup),
])
def test_it_matches_the_transformers_schedules(decay: str, make: object) -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = make(optimizer, 4, 20)  # type: ignore[operator]
    expected = []
    for _ in range(20):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    spec = ScheduleSpec(warmup_steps=4, decay=decay)  # type: ignore[arg-type]
    assert [lr_factor(spec, step, 20) for step in range(20)] == expected


def test_a_step_of_one_shard_is_gathered_and_a_step_of_several_shards_is_a_staircase() -> None:
    one = Timetable(shards=1, steps=2, micro_batches=4, eval_every=1, eval_batches=3)
    step = one.segment(1)
    assert (step.gathered, step.start, step.lanes, step.length) == (True, 0, 4, 1)
    assert [step.needs(i) for i in range(4)] == [[], [0], [0], [0, 1, 2]]
    assert one.segment(4).gathered and [one.segment(4).needs(i) for i in range(4, 7)] == [[], [4], [4, 5]]
    # a DPO trial's reference pass stays a chain (each batch appends to the log-probabilities before it)
    preference = Timetable(shards=1, steps=2, micro_batches=4, eval_every=1, eval_batches=3, reference_batches=2)
    reference = preference.segment(1)
    assert (reference.gathered, reference.needs(1)) == (False, [0])
    assert preference.segment(2).gathered and preference.segment(2).needs(5) == [2, 3, 4]
    several = Timetable(shards=2, steps=2, micro_batches=2, eval_every=1, eval_batches=1).segment(3)
    assert (several.gathered, [several.needs(i) for i in range(3, 6)]) == (False, [[0], [3, 1], [4, 2]])
