"""The memory preview decides "does it fit" with the engine's own solver: one rule, one set of numbers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest
from django.urls import reverse

from tests.webapp.experiments.test_forms import post_data
from webapp.experiments.memory_preview import FitError, layer_costs, memory_plan
from webapp.experiments.model_shapes import PRESETS, ModelShape
from worker.engine.config import LoraSpec
from worker.engine.errors import BudgetError
from worker.engine.partition import LayerCost, MemoryPlan, solve, solve_with_head_chunks
from worker.engine.sizes import optimizer_slots

SHAPE = PRESETS["gpt2-micro"][1]
WIDE = dataclasses.replace(SHAPE, vocab_size=50257)  # GPT-2's own vocabulary on the micro model


def _smallest_fitting_budget(costs: Sequence[LayerCost],
                             solver: Callable[[Sequence[LayerCost], int], MemoryPlan] = solve) -> int:
    low, high = 1, 1 << 34
    while low < high:  # the solver's own threshold, found by bisection
        middle = (low + high) // 2
        try:
            solver(costs, middle)
            high = middle
        except BudgetError:
            low = middle + 1
    return low


def _chunking_solver(shape: ModelShape, slots: int) -> Callable[[Sequence[LayerCost], int], MemoryPlan]:
    """The preview's solver for 4 x 64-token micro-batches: the head in token chunks when it must."""
    def solver(costs: Sequence[LayerCost], budget: int) -> MemoryPlan:
        return solve_with_head_chunks(costs, budget, tokens=4 * 64, chunked_head=lambda chunk: layer_costs(
            shape, batch=4, seq_len=64, slots=slots, head_token_chunk=chunk)[-1])
    return solver


@pytest.mark.parametrize("shape", [SHAPE, WIDE], ids=["vocab-0", "vocab-50257"])
@pytest.mark.parametrize(("optimizer", "momentum"), [("adamw", 0.9), ("sgd", 0.9), ("sgd", 0.0)])
def test_it_refuses_exactly_what_the_engine_solver_refuses(shape: ModelShape, optimizer: str, momentum: float) -> None:
    slots = optimizer_slots(optimizer, momentum)
    costs = layer_costs(shape, batch=4, seq_len=64, slots=slots)
    solver = _chunking_solver(shape, slots)
    threshold = _smallest_fitting_budget(costs, solver)
    plan = memory_plan(shape, batch=4, seq_len=64, optimizer=optimizer, momentum=momentum, budget_bytes=threshold)
    assert plan["shards"] == solver(costs, threshold).to_dict()["shards"]
    with pytest.raises(FitError) as refused:
        memory_plan(shape, batch=4, seq_len=64, optimizer=optimizer, momentum=momentum,
                    budget_bytes=threshold - 1)
    with pytest.raises(BudgetError) as solved:
        solver(costs, threshold - 1)
    assert (refused.value.layer, refused.value.needed_bytes) == (solved.value.layer, solved.value.needed_bytes)
    assert refused.value.needed_bytes > threshold - 1


def test_a_head_whose_logits_do_not_fit_is_planned_in_token_chunks() -> None:
    slots = optimizer_slots("adamw", 0.9)
    costs = layer_costs(WIDE, batch=4, seq_len=64, slots=slots)
    whole = _smallest_fitting_budget(costs)
    with pytest.raises(BudgetError) as whole_refused:
        solve(costs, whole - 1)
    assert whole_refused.value.layer == "head"  # 256 tokens x 50,257 logits decide this model's smallest budget
    roomy = memory_plan(WIDE, batch=4, seq_len=64, optimizer="adamw", momentum=0.9, budget_bytes=whole)
    assert roomy["head_token_chunk"] is None
    chunked = _smallest_fitting_budget(costs, _chunking_solver(WIDE, slots))
    assert chunked < whole / 2
    plan = memory_plan(WIDE, batch=4, seq_len=64, optimizer="adamw", momentum=0.9, budget_bytes=chunked)
    assert 16 <= plan["head_token_chunk"] < 256 and plan["peak_bytes"] <= chunked
    assert plan["layers"][-1]["activation_bytes"] < costs[-1].activation_bytes / 4
    # An adapter on the LM head has no chunked form: its trial needs the whole logits' room.
    with pytest.raises(FitError) as refused:
        memory_plan(WIDE, batch=4, seq_len=64, optimizer="adamw", momentum=0.9, budget_bytes=whole // 2,
                    lora=LoraSpec(r=8, alpha=16.0, target_modules=("c_attn", "lm_head")))
    assert refused.value.layer == "head"
    lora = memory_plan(WIDE, batch=4, seq_len=64, optimizer="adamw", momentum=0.9, budget_bytes=whole // 2,
                       lora=LoraSpec(r=8, alpha=16.0, target_modules=("c_attn",)))
    assert lora["head_token_chunk"] is not None


def test_the_optimizer_state_streams_so_it_does_not_decide_the_fit() -> None:
    adamw = layer_costs(SHAPE, batch=4, seq_len=64, slots=2)
    plain = layer_costs(SHAPE, batch=4, seq_len=64, slots=0)
    assert _smallest_fitting_budget(adamw) == _smallest_fitting_budget(plain)
    assert sum(c.state_bytes for c in adamw) > sum(c.state_bytes for c in plain)


@pytest.mark.django_db
def test_the_preview_page_says_when_a_trials_head_runs_in_chunks(alice_client, alice_dataset) -> None:
    # A one-block GPT-2 16 wide on 256 x 32 tokens a micro-batch: its whole logits (the dataset's 300-token
    # vocabulary; 30 MiB with their gradients) outgrow a 16 MiB budget, its block's activations do not.
    space = ("model: {family: gpt2, n_layer: 1, n_embd: 16, n_head: 1, n_positions: 256}\n"
             "batch_size: {values: [256]}\nseq_len: {values: [32]}\nlr: {values: [0.001]}\n")
    response = alice_client.post(reverse("experiment_create"), post_data(
        alice_dataset, rows=[], space_text=space, memory_budget_mib=16, action="preview"))
    assert response.status_code == 200, response.content.decode()[-2000:]
    [row] = response.context["preview"]["trials"]
    chunk = row["plan"]["head_token_chunk"]
    assert chunk is not None and chunk < 256 * 32
    assert f"(head in {chunk}-token chunks)" in response.content.decode()
