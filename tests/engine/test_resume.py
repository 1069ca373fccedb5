"""The store is the checkpoint: stopping and reopening, in one process or turn by turn in two, end with the
same weights (a SIGKILL at each point of a unit: test_crash_points.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import TrialSession, trial_create

CUTS = [0, 2, 4]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model-00001-of-00003.safetensors") | load_file(
        directory / "model-00002-of-00003.safetensors") | load_file(directory / "model-00003-of-00003.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tokens_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], Path]:
    root = tmp_path_factory.mktemp("uninterrupted")
    trial_create(spec=tiny_spec(tokens_path), spill_dir=root, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=root, trial_id="t", device=CPU)
    losses = [r.loss for r in run_all(session) if r.loss is not None]
    session.export(root / "final")
    return losses, root / "final"


def test_it_resumes_after_step_7_with_the_same_numbers(
    tokens_path: Path, tmp_path: Path, uninterrupted: tuple[list[float], Path]
) -> None:
    trial_create(spec=tiny_spec(tokens_path), spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    first = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    losses = []
    while not losses or len(losses) < 8:
        result = first.run_unit()
        if result.loss is not None:
            losses.append(result.loss)
    del first
    second = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    losses += [r.loss for r in run_all(second) if r.loss is not None]
    second.export(tmp_path / "final")
    assert losses == uninterrupted[0]
    for name, tensor in weights(uninterrupted[1]).items():
        assert torch.equal(weights(tmp_path / "final")[name], tensor), name


def test_two_sessions_can_take_turns_like_two_worker_processes(
    tokens_path: Path, tmp_path: Path, uninterrupted: tuple[list[float], Path]
) -> None:
    trial_create(spec=tiny_spec(tokens_path), spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    sessions = [TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU) for _ in range(2)]
    losses, turn = [], 0
    while sessions[turn % 2].next_unit() is not None:
        for _ in range(turn % 3 + 1):  # uneven turns, so each session sees the other's commits
            if sessions[turn % 2].next_unit() is None:
                break
            result = sessions[turn % 2].run_unit()
            if result.loss is not None:
                losses.append(result.loss)
        turn += 1
    sessions[0].export(tmp_path / "final")
    assert losses == uninterrupted[0]
    for name, tensor in weights(uninterrupted[1]).items():
        assert torch.equal(weights(tmp_path / "final")[name], tensor), name
