"""Re-partitioning a trial's store anywhere in training keeps it exact (the engine half of OOM recovery):
the segment in flight is rolled back and replayed under the new plan with the numbers of the old one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, tiny_spec
from worker.engine import BudgetError, EngineError, TrialSession, TrialSpec, trial_create
from worker.engine.errors import StaleWriterError
from worker.engine.repartition import repartition

PLAN = [0, 2, 4]  # 3 shards of the 6-layer stack: 5 units per micro-batch, 10 per step, 6 per evaluation
NEW_PLAN = [0, 1, 3, 5]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def metrics(session: TrialSession, units: int | None = None) -> list[tuple[str, int, float]]:
    """Run ``units`` units (all when None); return the step and evaluation losses they reported."""
    out = []
    while session.next_unit() is not None and (units is None or units > 0):
        result = session.run_unit()
        units = None if units is None else units - 1
        if result.loss is not None:
            out.append(("loss", result.unit.step, result.loss))
        if result.eval_loss is not None:
            out.append(("eval", result.unit.step, result.eval_loss))
    return out


def reference(spec: TrialSpec, root: Path) -> tuple[list[tuple[str, int, float]], dict[str, torch.Tensor]]:
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=PLAN)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    out = metrics(session)
    session.export(root / "export")
    return out, weights(root / "export")


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


SGD = {"optimizer": dataclasses.replace(tiny_spec(Path("x")).optimizer, kind="sgd", lr=0.05, momentum=0.9)}


# Unit indexes with PLAN, 8 steps, evaluation after steps 4 and 7 (units 50-55 and 86-91):
#   0 before anything, 1 mid-forward, 4 mid-backward, 7 second micro-batch, 30 a step boundary,
#   52 mid-evaluation, 61 in the step after an evaluation (its pending updates partly applied by it).
@pytest.mark.parametrize("after_units", [0, 1, 4, 7, 30, 52, 61])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_replan_anywhere_continues_with_the_numbers_of_the_old_plan(
    tokens_path: Path, tmp_path: Path, after_units: int, optimizer: str
) -> None:
    spec = tiny_spec(tokens_path, steps=8, **(SGD if optimizer == "sgd" else {}))
    expected, expected_weights = reference(spec, tmp_path / "plain")

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=PLAN)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    seen = metrics(session, after_units)
    plan = repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=NEW_PLAN, token=1)
    assert [s.first for s in plan.shards] == NEW_PLAN
    seen += metrics(session)  # the same session object picks the new plan up from the store
    assert len(session.plan.shards) == 4
    session.export(tmp_path / "export")
    assert seen == expected
    assert_same_weights(weights(tmp_path / "export"), expected_weights)


def test_a_replan_during_the_final_updates_is_exact(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, steps=3, eval_every=0)  # ends with S units: 3 steps x 10, then S0 S1 S2
    expected, expected_weights = reference(spec, tmp_path / "plain")
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=PLAN)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    seen = metrics(session, 31)  # S0 ran
    repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 3], token=1)
    assert session.remaining_units() == 2  # S0 and S1 of the new plan
    seen += metrics(session)
    session.export(tmp_path / "export")
    assert seen == expected
    assert_same_weights(weights(tmp_path / "export"), expected_weights)


def test_a_unit_that_runs_out_of_memory_commits_nothing_and_a_smaller_plan_recovers(
    tokens_path: Path, tmp_path: Path
) -> None:
    """The scheduler's recovery, in one process: the fault-injection hook plays a GPU smaller than the plan."""
    spec = tiny_spec(tokens_path, steps=6)
    trial_create(spec=spec, spill_dir=tmp_path / "plain", trial_id="t", device=CPU)
    plain = TrialSession.open(spill_dir=tmp_path / "plain", trial_id="t", device=CPU)
    expected = metrics(plain)
    plain.export(tmp_path / "plain" / "export")

    plan = trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    seen = metrics(session, 13)
    largest = max(plan.unit_peak_bytes(s.index) for s in plan.shards)
    session.fault_oom_above_bytes = largest - 1
    budget = plan.budget_bytes
    replans = 0
    while session.next_unit() is not None:
        cursor = session.store.manifest["cursor"]
        try:
            result = session.run_unit()
        except torch.OutOfMemoryError:
            assert session.store.manifest["cursor"] == cursor  # nothing of the failed unit was committed
            budget = int(budget * 0.75)
            new = repartition(spill_dir=tmp_path, trial_id="t", device=CPU, budget_bytes=budget, token=2 + replans)
            replans += 1
            assert new.budget_bytes == budget
            continue
        if result.loss is not None:
            seen.append(("loss", result.unit.step, result.loss))
        if result.eval_loss is not None:
            seen.append(("eval", result.unit.step, result.eval_loss))
    assert replans >= 1
    assert all(session.plan.unit_peak_bytes(s.index) < largest for s in session.plan.shards)
    session.export(tmp_path / "export")
    assert seen == expected
    assert_same_weights(weights(tmp_path / "export"), weights(tmp_path / "plain" / "export"))


def test_it_refuses_a_budget_a_layer_cannot_fit_and_leaves_the_trial_as_it_was(
    tokens_path: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(tokens_path, steps=2)
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=PLAN)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    metrics(session, 3)
    before = {k: v for k, v in session.store.manifest.items() if k != "version"}
    with pytest.raises(BudgetError, match="budget"):
        repartition(spill_dir=tmp_path, trial_id="t", device=CPU, budget_bytes=1000, token=1)
    after = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU).store.manifest
    assert {k: v for k, v in after.items() if k not in ("version", "fence")} == {
        k: v for k, v in before.items() if k != "fence"}
    metrics(session)
    with pytest.raises(EngineError, match="finished"):
        repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=NEW_PLAN, token=2)


def test_a_second_device_s_replan_for_the_same_out_of_memory_is_refused(tokens_path: Path, tmp_path: Path) -> None:
    """Two devices ran micro-batches of one trial and both ran out of memory: the first re-plans it; the second,
    whose unit saw the trial before that re-plan, is refused and changes nothing, so the plan is not shrunk twice."""
    trial_create(spec=tiny_spec(tokens_path, micro_batches=2, steps=2), spill_dir=tmp_path, trial_id="t",
                 device=CPU, cuts=[0])
    first = repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 2, 4], token=5, replans=0)
    with pytest.raises(StaleWriterError, match="re-planned since"):
        repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 3], token=6, replans=0)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert (session.state.replans, session.plan) == (1, first)
