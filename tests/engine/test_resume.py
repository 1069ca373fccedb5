"""The store is the checkpoint: stopping, reopening and even SIGKILL mid-unit end with the same weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
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


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from worker.engine import TrialSession
    from worker.engine.spill_store import SpillStore

    spill_dir, target = Path(sys.argv[1]), int(sys.argv[2])
    session = TrialSession.open(spill_dir=spill_dir, trial_id="t", device=torch.device("cpu"))
    real_commit = SpillStore.commit

    def slow_commit(store):
        if store.manifest["cursor"] == target + 1:  # every output of unit `target` is written, not committed
            print("COMMITTING", flush=True)
            time.sleep(60)
        real_commit(store)

    SpillStore.commit = slow_commit
    while session.next_unit() is not None:
        session.run_unit()
""")


@pytest.mark.parametrize("target", [37, 43])  # a B unit of step 3, and the FB unit of step 4's micro-batch 0
def test_it_survives_sigkill_mid_unit(
    target: int, tokens_path: Path, tmp_path: Path, uninterrupted: tuple[list[float], Path]
) -> None:
    trial_create(spec=tiny_spec(tokens_path), spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(target)],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
                             env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "COMMITTING"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)

    resumed = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert resumed.next_unit() is not None and resumed.next_unit().index == target  # type: ignore[union-attr]
    committed = resumed.store.manifest["version"]
    assert any(int(p.stem.rpartition("@")[2]) > committed for p in (tmp_path / "t").glob("*.bin"))
    resumed.run_unit()  # re-runs the killed unit, first removing what it left behind
    assert all(int(p.stem.rpartition("@")[2]) <= committed + 1 for p in (tmp_path / "t").glob("*.bin"))
    run_all(resumed)
    resumed.export(tmp_path / "final")
    for name, tensor in weights(uninterrupted[1]).items():
        assert torch.equal(weights(tmp_path / "final")[name], tensor), name
