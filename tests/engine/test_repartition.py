"""Re-partitioning a trial's store at a step boundary keeps training exact (OOM recovery's engine half)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import SpecError, TrialSession, trial_create
from worker.engine.repartition import at_step_boundary, repartition


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@pytest.mark.parametrize(("optimizer", "steps_before"), [("adamw", 6), ("sgd", 1)])
def test_it_trains_on_after_a_replan_with_the_numbers_of_plain_training(
    tokens_path: Path, tmp_path: Path, optimizer: str, steps_before: int
) -> None:
    base = tiny_spec(tokens_path, steps=8)
    spec = base if optimizer == "adamw" else tiny_spec(
        tokens_path, steps=8, optimizer=type(base.optimizer)(kind="sgd", lr=0.05, momentum=0.9, clip_norm=0.5))
    trial_create(spec=spec, spill_dir=tmp_path / "plain", trial_id="t", device=CPU, cuts=[0, 2, 4])
    plain = TrialSession.open(spill_dir=tmp_path / "plain", trial_id="t", device=CPU)
    expected = [r.loss for r in run_all(plain) if r.loss is not None]
    plain.export(tmp_path / "plain-export")

    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 2, 4])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    losses = [session.run_unit().loss]  # one unit into step 0
    with pytest.raises(SpecError, match="mid-step"):
        repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 1, 3, 5])
    while len([x for x in losses if x is not None]) < steps_before or not at_step_boundary(session):
        losses.append(session.run_unit().loss)
    losses = [x for x in losses if x is not None]
    plan = repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 1, 3, 5], token=1)
    assert len(plan.shards) == 4
    replanned = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert len(replanned.plan.shards) == 4
    losses += [r.loss for r in run_all(replanned) if r.loss is not None]
    replanned.export(tmp_path / "export")
    assert losses == expected
    actual, reference = weights(tmp_path / "export"), weights(tmp_path / "plain-export")
    assert actual.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(actual[name], tensor), name
