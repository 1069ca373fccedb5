"""The trial state: one typed owner of the manifest's trial keys, which round-trip through JSON exactly and
are refused, by name, when one is missing or unknown."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker.engine import DataSpec, OptimizerSpec, TrialSpec
from worker.engine.errors import SpillStoreError
from worker.engine.partition import LayerCost, plan_with_shards
from worker.engine.spill_store import SpillStore
from worker.engine.trial_state import EarlyStop, EvalState, PendingStep, ShardState, StepState, TrialState


def mid_trial() -> TrialState:
    """A state with every part set: a pending step, partial gradients, running sums, an early-stop record."""
    spec = TrialSpec(data=DataSpec(tokens_path="/data/tokens.npy"), optimizer=OptimizerSpec(betas=(0.8, 0.9)),
                     steps=5, eval_every=1, early_stop_patience=2)
    costs = [LayerCost(name=f"l{i}", param_bytes=64, grad_bytes=64, optim_bytes=128, activation_bytes=32,
                       forward_s=0.1 * i, time_s=0.3) for i in range(3)]
    state = TrialState.start(trial_id="t", spec=spec, plan=plan_with_shards(costs, [0, 2], 1 << 20))
    state.cursor = 7
    state.shards[0] = ShardState(pending=True, grad="partial", optim_steps=3)
    state.pending = PendingStep(2, 0.1 + 0.2)
    state.step_state = StepState(loss_sum=1 / 3, norms={1: [0.5, 1e-30]},
                                 parked={2: [0.75], 4: [0.5, -0.25, -1.0, 0.5]})
    state.eval_state.parked = {3: [1.5, 7, 20], 4: [2, 1.25, 0.5, -0.5, 1, 9.5, 14, 40]}
    state.eval_state.loss_sum = 2.25
    state.early_stop = EarlyStop(best=3.5, since=1)
    state.replans = 2
    return state


def test_it_round_trips_through_json_to_an_equal_state() -> None:
    state = mid_trial()
    manifest = state.to_manifest()
    assert json.loads(json.dumps(manifest)) == manifest  # already in JSON's own types
    assert TrialState.from_manifest(json.loads(json.dumps(manifest))) == state
    assert TrialState.start(trial_id="t", spec=state.spec, plan=state.plan) != state


def test_it_reuses_a_known_spec_and_plan_until_the_trial_is_replanned() -> None:
    state = mid_trial()
    manifest = json.loads(json.dumps(state.to_manifest()))
    again = TrialState.from_manifest(manifest, known=state)
    assert again == state and again.spec is state.spec and again.plan is state.plan
    costs = list(state.plan.layers)
    manifest |= {"replans": 3, "plan": plan_with_shards(costs, [0, 1, 2], 1 << 20).to_dict(),
                 "shards": [{"pending": False, "grad": "empty", "optim_steps": 3}] * 3}
    replanned = TrialState.from_manifest(json.loads(json.dumps(manifest)), known=state)
    assert replanned.plan is not state.plan and len(replanned.plan.shards) == 3
    assert replanned == TrialState.from_manifest(json.loads(json.dumps(manifest)))


def test_it_leaves_the_store_keys_to_the_store(tmp_path: Path) -> None:
    state = mid_trial()
    store = SpillStore.create(tmp_path / "t", state.to_manifest())
    store.commit()
    reopened = SpillStore.open(tmp_path / "t")
    assert TrialState.of(reopened) == state
    state.cursor = 8
    state.stage_in(reopened)
    reopened.commit()
    assert TrialState.of(SpillStore.open(tmp_path / "t")).cursor == 8


def test_it_reads_a_trial_never_evaluated_nor_replanned_without_those_keys() -> None:
    manifest = mid_trial().to_manifest()
    del manifest["early_stop"], manifest["replans"]
    state = TrialState.from_manifest(manifest)
    assert (state.early_stop, state.replans) == (EarlyStop(), 0)


def test_it_reads_a_store_written_before_sums_were_parked() -> None:
    manifest = json.loads(json.dumps(mid_trial().to_manifest()))
    del manifest["step_state"]["parked"], manifest["eval_state"]["parked"]
    state = TrialState.from_manifest(manifest)
    assert (state.step_state.parked, state.eval_state.parked) == ({}, {})


def test_it_reads_a_parked_loss_stored_alone_as_a_number() -> None:
    """A store written before a parked micro-batch kept its DPO reward parts beside its loss."""
    manifest = json.loads(json.dumps(mid_trial().to_manifest()))
    manifest["step_state"]["parked"] = {"2": 0.75}
    assert TrialState.from_manifest(manifest).step_state.parked == {2: [0.75]}


def test_parked_sums_add_up_by_name() -> None:
    step = StepState(loss_sum=1.0)
    step.add([0.5])
    step.add([0.25, 0.5, -0.5, 1.0])
    assert (step.loss_sum, step.chosen_reward, step.rejected_reward, step.reward_accuracy) == (1.75, 0.5, -0.5, 1.0)
    evaluation = EvalState()
    evaluation.add([1.5, 7.0, 20.0])
    evaluation.add([2, 1.25, 0.5, -0.5, 1, 9.5, 14, 40])
    assert (evaluation.token_loss_sum, evaluation.tokens, evaluation.bytes) == (11.0, 21, 60)
    assert (evaluation.pairs, evaluation.pair_loss_sum, evaluation.chosen_reward_sum, evaluation.rejected_reward_sum,
            evaluation.accurate) == (2, 1.25, 0.5, -0.5, 1)
    assert isinstance(evaluation.tokens, int) and isinstance(evaluation.accurate, int)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.pop("cursor"), "manifest lacks 'cursor'"),
    (lambda m: m.update(curser=0), "manifest has unknown 'curser'"),
    (lambda m: m["shards"][0].pop("optim_steps"), "shards\\[\\] lacks 'optim_steps'"),
    (lambda m: m["step_state"].update(extra=1), "step_state has unknown 'extra'"),
    (lambda m: m.update(pending={"step": 1}), "pending lacks 'total_norm'"),
])
def test_it_refuses_a_missing_or_unknown_key_by_name(edit: Callable[[dict[str, Any]], object], message: str) -> None:
    manifest = mid_trial().to_manifest()
    edit(manifest)
    with pytest.raises(SpillStoreError, match=message):
        TrialState.from_manifest(manifest)
