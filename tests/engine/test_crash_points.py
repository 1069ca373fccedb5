"""A unit killed at any named point (worker.engine.faults) leaves the last commit; resuming re-runs that
unit once and training ends with plain PyTorch's losses and weights. A unit that runs out of memory at a
compute point commits nothing, and re-planning the trial keeps it exact.

The killed process is a fork of this one (importing torch again would cost more than the trial), stopped
by the fault at its point and then SIGKILLed: the kill lands exactly there, not wherever a timer fell.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import CPU, tiny_spec
from tests.plain_pytorch import Reference, assert_bit_identical, exported_weights, plain_reference
from worker.engine import TrialSession, TrialSpec, trial_create
from worker.engine.faults import REACHED, Fault
from worker.engine.repartition import repartition
from worker.engine.spill_store import MANIFEST

CUTS = [0, 2, 4]  # 3 shards: per micro-batch F0 F1 FB2 B1 B0, 10 units per step; evaluations after steps 4, 5
STEPS = 6
# Timetable units: 10 F0 of step 1 (applies shard 0's update), 11 F1 (applies shard 1's, then its forward
# keeps a graph), 13 B1 (backward through that kept graph), 14 B0 of micro-batch 0 (completes no step),
# 37 B1 of step 3's second micro-batch; 72 is the export after the last unit.
KILL_POINTS = {
    "before-compute": 13, "mid-forward": 11, "mid-backward": 13, "mid-step": 10, "before-write": 14,
    "mid-write": 10, "before-commit": 37, "after-commit": 14, "mid-export": 72,
}
# Whether the killed unit left files behind (its staged buffers, never committed).
LEFT_FILES = {"before-compute": False, "before-write": False, "mid-step": True, "mid-write": True,
              "before-commit": True}
OOM_POINTS = {"before-compute": 13, "mid-forward": 11, "mid-backward": 13, "mid-step": 10}


def spec_of(tokens_path: Path) -> TrialSpec:
    return tiny_spec(tokens_path, steps=STEPS)


@pytest.fixture(scope="module")
def reference(tokens_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return plain_reference(spec_of(tokens_path), tmp_path_factory.mktemp("reference"))


def files(trial_dir: Path) -> set[str]:
    return {p.name for p in trial_dir.glob("*.bin")}


def referenced(trial_dir: Path) -> set[str]:
    manifest = json.loads((trial_dir / MANIFEST).read_text())
    return {f"{name}@{version}.bin" for name, version in manifest["files"].items()}


def record(log: Path, result: object) -> None:
    with open(log, "a") as f:
        f.write(json.dumps({"unit": result.unit.index, "loss": result.loss, "eval_loss": result.eval_loss}) + "\n")


def train_in_child(spill_dir: Path, fault: Fault, log: Path, export_dir: Path) -> int:
    """Fork a process that trains the trial to the end (recording each unit's result in `log`) and
    exports it, with `fault` armed; return its pid."""
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        session = TrialSession.open(spill_dir=spill_dir, trial_id="t", device=CPU)
        session.fault = fault
        while session.next_unit() is not None:
            record(log, session.run_unit())
        session.export(export_dir)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)  # never return into pytest


def kill_at(pid: int, fault: Fault, timeout_s: float = 120) -> dict[str, object]:
    """Wait until the child is blocked at the fault's point, SIGKILL it; return what the fault reported."""
    deadline = time.monotonic() + timeout_s
    while not (fault.signal_dir / REACHED).exists():
        done, status = os.waitpid(pid, os.WNOHANG)
        assert not done, f"the child ended (status {status}) before reaching {fault.point}"
        assert time.monotonic() < deadline, f"the child did not reach {fault.point} in {timeout_s} s"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return json.loads((fault.signal_dir / REACHED).read_text())


def assert_plain(losses: list[float], eval_losses: list[float], export_dir: Path, reference: Reference) -> None:
    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(exported_weights(export_dir), reference.weights)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_unit_killed_at_any_point_reruns_once_and_ends_like_plain_pytorch(
    point: str, tokens_path: Path, tmp_path: Path, reference: Reference
) -> None:
    target = KILL_POINTS[point]
    trial_create(spec=spec_of(tokens_path), spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    trial_dir, log, export_dir = tmp_path / "t", tmp_path / "units.jsonl", tmp_path / "export"
    fault = Fault(point=point, unit=target, signal_dir=tmp_path / "fault")
    reached = kill_at(train_in_child(tmp_path, fault, log, export_dir), fault)
    assert (reached["point"], reached["unit"]) == (point, target)

    ran = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    resumed = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    committed = resumed.store.commit_version
    if point == "after-commit":  # the unit is committed; only its result never reached its caller
        assert [r["unit"] for r in ran] == list(range(target)) and resumed.cursor == target + 1
    elif point == "mid-export":
        assert [r["unit"] for r in ran] == list(range(target)) and resumed.next_unit() is None
    else:
        assert [r["unit"] for r in ran] == list(range(target)) and resumed.cursor == target
        left = files(trial_dir) - referenced(trial_dir)
        assert all(int(name.rpartition("@")[2].removesuffix(".bin")) == committed + 1 for name in left), left
        if point in LEFT_FILES:
            assert bool(left) == LEFT_FILES[point], left

        result = resumed.run_unit()  # the killed unit, started a second time
        record(log, result)
        assert result.unit.index == target
        assert resumed.store.commit_version == committed + 1  # committed once: one commit for the unit
        assert files(trial_dir) == referenced(trial_dir)  # nothing of the killed run is left over
    while resumed.next_unit() is not None:
        record(log, resumed.run_unit())
    resumed.export(export_dir)

    ran = [json.loads(line) for line in log.read_text().splitlines()]
    # Each unit's result once, in order; a unit killed after its commit has none (and reports no loss).
    assert [r["unit"] for r in ran] == [u for u in range(len(resumed.timetable))
                                        if (point, u) != ("after-commit", target)]
    assert_plain([r["loss"] for r in ran if r["loss"] is not None],
                 [r["eval_loss"] for r in ran if r["eval_loss"] is not None], export_dir, reference)


@pytest.mark.parametrize("point", OOM_POINTS)
def test_a_unit_out_of_memory_at_a_compute_point_commits_nothing_and_a_replan_stays_exact(
    point: str, tokens_path: Path, tmp_path: Path, reference: Reference
) -> None:
    target = OOM_POINTS[point]
    trial_create(spec=spec_of(tokens_path), spill_dir=tmp_path, trial_id="t", device=CPU, cuts=CUTS)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    session.fault = Fault(point=point, action="oom", unit=target, signal_dir=tmp_path / "fault")
    results = [session.run_unit() for _ in range(target)]
    committed = session.store.commit_version
    with pytest.raises(torch.OutOfMemoryError, match=f"fault injection: out of memory at {point} of unit {target}"):
        session.run_unit()
    assert (session.cursor, session.store.commit_version) == (target, committed)
    on_disk = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    assert (on_disk.cursor, on_disk.store.commit_version) == (target, committed)

    plan = repartition(spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0, 1, 3, 5], token=1)
    assert len(plan.shards) == 4
    while session.next_unit() is not None:
        results.append(session.run_unit())
    assert len(session.plan.shards) == 4
    assert files(tmp_path / "t") == referenced(tmp_path / "t")
    session.export(tmp_path / "export")
    assert_plain([r.loss for r in results if r.loss is not None],
                 [r.eval_loss for r in results if r.eval_loss is not None], tmp_path / "export", reference)
