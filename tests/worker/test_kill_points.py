"""Real device workers killed, frozen or out of memory at a named point of a unit (HYDRA_FAULT).

The fault stops the worker at its point and reports it (worker.engine.faults), so each test acts on a unit
known to be exactly there, never on wherever a timer happened to fall. Every unit's completion carries its
place in the engine's timetable (step, micro-batch, phase, shard), so the spans say which units completed,
on which device; the killed or frozen unit was started by its victim (the fault's report names its process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.worker.device_workers import DeviceWorkers
from tests.worker.test_engine_trials import assert_trained_like_plain_pytorch, tiny_trial
from worker.contract import EngineJob
from worker.engine.config import TrialSpec
from worker.engine.faults import REACHED, RELEASE
from worker.engine.schedule import Timetable
from worker.engine.session import TrialSession, trial_create

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]

Unit = tuple[int, int, str, int]  # step, micro-batch, phase, shard


def planned_timetable(trial: TrialSpec, root: Path) -> Timetable:
    """The trial's timetable, planned here as a CPU worker plans it (the plan depends on sizes, not timings)."""
    trial_create(spec=trial, spill_dir=root, trial_id="probe", device=torch.device("cpu"))
    return TrialSession.open(spill_dir=root, trial_id="probe", device=torch.device("cpu")).timetable


def timetable(trial: TrialSpec, root: Path) -> list[Unit]:
    """The trial's units, in timetable order (`planned_timetable`)."""
    return [(u.step, u.micro_batch, u.phase, u.shard) for u in planned_timetable(trial, root)]


def assert_each_once_in_wavefront_order(done: list[tuple[Unit, str]], table: Timetable) -> None:
    """Every unit of `table` completed once, and each after the units it needs (a trial on two devices runs the
    micro-batches of a step as a wavefront: micro-batch m's unit after m - 1's at the same place, and after its own
    chain's unit before it; a segment after the whole segment before it)."""
    units = [(u.step, u.micro_batch, u.phase, u.shard) for u in table]
    order = [units.index(unit) for unit, _ in done]
    assert sorted(order) == list(range(len(units))), "each unit completed once"
    seen: set[int] = set()
    for index in order:
        segment = table.segment(index)
        assert all(n in seen for n in [*segment.needs(index), *range(segment.start)]), units[index]
        seen.add(index)


def completed_on(done: list[tuple[Unit, str]], unit: Unit) -> str:
    (device,) = [device for u, device in done if u == unit]
    return device


def start(device_workers, tmp_path: Path, fault: str, *, lease_s: float = 1.5) -> DeviceWorkers:
    """Two CPU workers, both armed with `fault` (it fires once, in whichever reaches it first); a short
    lease, so that another device soon re-runs the unit of a worker killed or frozen."""
    return device_workers("cpu0", "cpu1", lease_s=lease_s,
                          env={"HYDRA_FAULT": fault, "HYDRA_FAULT_DIR": str(tmp_path / "fault")})


def blocked(workers: DeviceWorkers, tmp_path: Path) -> tuple[str, dict[str, object]]:
    """Wait until a worker is blocked at the fault's point; return its device and the fault's report."""
    path = tmp_path / "fault" / REACHED
    workers.wait(path.exists, 120, "a worker to reach the fault's point")
    report = json.loads(path.read_text())
    group = os.getpgid(int(report["pid"]))  # the unit runs in the worker's pool process, in its group
    return next(name for name, process in workers.processes.items() if process.pid == group), report


def completed(workers: DeviceWorkers, trial_id: str) -> list[tuple[Unit, str]]:
    """The units of `trial_id` whose completion the queue accepted, in order, with their devices."""
    spans = sorted((s for s in workers.entries("spans") if s["trial"] == trial_id and s["shard"] != -1),
                   key=lambda s: s["start"])
    return [((s["step"], s["micro_batch"], s["phase"], s["shard"]), s["device"]) for s in spans]


def killed_at(device_workers, tmp_path: Path, trial: TrialSpec, point: str,
              target: int) -> tuple[DeviceWorkers, str, list[tuple[Unit, str]]]:
    """Train `trial` as "k" on two workers armed to block at `point` of unit `target`, kill the one that reaches it,
    and wait for the trial to finish after one requeue: the workers, the victim's device, the units done."""
    workers = start(device_workers, tmp_path, f"{point}@{target}")
    workers.queue.submit(trial_id="k", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "k"))
    victim, report = blocked(workers, tmp_path)
    assert (report["point"], report["unit"]) == (point, target)
    workers.kill(victim)
    record = workers.wait_for_records(["k"], {"finished", "failed"}, 120)["k"]
    assert (record.state, record.requeues) == ("finished", 1), record.message
    return workers, victim, completed(workers, "k")


@pytest.mark.parametrize("point", ["mid-write", "after-commit", "mid-export"])
def test_a_worker_killed_at_a_point_of_a_unit_is_recovered_from_exactly(
    point: str, device_workers, tokens: str, tmp_path: Path
) -> None:
    """mid-write: the unit re-runs on the other device. after-commit: the unit is committed but never
    reported; the other device reports it, with the step's loss it committed, and goes on after it.
    mid-export: the last unit is committed and the export half written; the other device exports the trial."""
    trial = tiny_trial(tokens, seed=7, lr=2e-3, steps=4)
    units = timetable(trial, tmp_path / "probe")
    if point == "mid-write":
        # The first unit of step 1 applies shard 0's update and then runs its forward: it writes several
        # buffers and completes no step.
        target = units.index((1, 0, "F", 0))
    elif point == "after-commit":
        # The unit that completes step 1's backward: it carries the step's loss.
        target = max(i for i, (step, _, phase, _) in enumerate(units) if step == 1 and phase in ("B", "FB"))
    else:
        target = len(units)  # the export comes after the last unit
    workers, victim, done = killed_at(device_workers, tmp_path, trial, point, target)
    assert_each_once_in_wavefront_order(done, Timetable.of(trial, shards=len({u[3] for u in units})))
    last = len(units) - 1 if point == "mid-export" else target
    assert completed_on(done, units[last]) != victim  # the unit the victim started completed on the other device
    steps = sorted(int(s["step"]) for s in workers.entries("steps") if s["trial"] == "k")
    assert steps == list(range(trial.steps))  # every step's loss reported once, the killed unit's too
    assert_trained_like_plain_pytorch(workers, "k", trial, tmp_path)


def test_a_worker_frozen_mid_unit_past_its_lease_cannot_commit(device_workers, tokens: str, tmp_path: Path) -> None:
    """SIGSTOP the worker blocked in the middle of writing a unit, so its lease expires; the other device
    re-runs that unit and more; then let it go on: the spill store refuses its unit (fencing), it drops the
    unit, and the trial ends with plain PyTorch's numbers."""
    trial = tiny_trial(tokens, seed=11, lr=2e-3, steps=4)
    units = timetable(trial, tmp_path / "probe")
    target = units.index((1, 0, "F", 0))
    workers = start(device_workers, tmp_path, f"mid-write@{target}")
    workers.queue.submit(trial_id="s", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "s"))
    victim, _ = blocked(workers, tmp_path)
    workers.freeze(victim)
    workers.wait(lambda: len(completed(workers, "s")) >= target + 2, 60, "the other device to run the unit and more")
    log = workers.root / f"{victim}.log"
    (tmp_path / "fault" / RELEASE).touch()
    workers.thaw(victim)
    workers.wait(lambda: "unit dropped" in log.read_text(), 60, "the frozen worker to drop its unit")
    assert "StaleWriterError" not in "".join(line for line in log.read_text().splitlines(True)
                                             if "failed in" in line)  # dropped, never a failed trial

    record = workers.wait_for_records(["s"], {"finished", "failed"}, 120)["s"]
    assert (record.state, record.requeues) == ("finished", 1), record.message
    done = completed(workers, "s")
    # the frozen unit completed once, by the other device
    assert_each_once_in_wavefront_order(done, Timetable.of(trial, shards=len({u[3] for u in units})))
    assert completed_on(done, units[target]) != victim
    assert_trained_like_plain_pytorch(workers, "s", trial, tmp_path)


def test_a_unit_out_of_memory_mid_backward_is_replanned_and_stays_exact(
    device_workers, tokens: str, tmp_path: Path
) -> None:
    """The fault raises torch.OutOfMemoryError inside autograd's backward of a unit of a one-shard trial:
    the worker re-plans it under a smaller budget, and the trial ends with plain PyTorch's numbers."""
    trial = tiny_trial(tokens, seed=3, lr=2e-3, steps=4, budget_bytes=400_000)
    units = timetable(trial, tmp_path / "probe")
    assert len({shard for *_, shard in units}) == 1
    target = units.index((1, 0, "FB", 0))
    # The default lease: here no worker dies, and on a busy machine re-planning can outlast a short one.
    workers = start(device_workers, tmp_path, f"mid-backward:oom@{target}", lease_s=10.0)
    workers.queue.submit(trial_id="o", job=EngineJob(trial=trial), export_dir=str(tmp_path / "exports" / "o"))
    record = workers.wait_for_records(["o"], {"finished", "failed"}, 180)["o"]
    assert (record.state, record.replans) == ("finished", 1), record.message
    assert len(record.plan["shards"]) > 1 and record.plan["budget_bytes"] <= int(trial.budget_bytes * 0.75)
    report = json.loads((tmp_path / "fault" / REACHED).read_text())
    assert (report["point"], report["unit"]) == ("mid-backward", target)
    events = workers.client.xrange(workers.queue.key("events"))
    replanned = [f["message"] for _, f in events if f["trial"] == "o" and f["message"].startswith("re-planned")]
    assert len(replanned) == 1 and f"out of memory at mid-backward of unit {target}" in replanned[0], replanned
    assert_trained_like_plain_pytorch(workers, "o", trial, tmp_path)


@pytest.mark.parametrize("point", ["before-write", "after-commit"])
def test_a_worker_killed_in_a_micro_batch_of_a_one_shard_step_is_recovered_from_exactly(
    point: str, device_workers, tokens: str, tmp_path: Path
) -> None:
    """A model of one shard runs the micro-batches of a step side by side, each adding its gradient to the sum or
    parking it (its one buffer): a worker killed as it starts to write it, or after its commit before anyone heard
    of it, leaves the other device to finish the trial with plain PyTorch's numbers."""
    trial = tiny_trial(tokens, seed=5, lr=2e-3, steps=3, budget_bytes=4_000_000)
    trial = TrialSpec.from_dict({**trial.to_dict(), "batch_size": 8, "micro_batches": 4})
    table = planned_timetable(trial, tmp_path / "probe")
    units = [(u.step, u.micro_batch, u.phase, u.shard) for u in table]
    assert {shard for *_, shard in units} == {0}
    target = units.index((1, 2, "FB", 0))
    workers, victim, done = killed_at(device_workers, tmp_path, trial, point, target)
    if point == "after-commit":
        # The victim committed its unit before it was killed; the other device reports it only when it finds it
        # committed, after the lease ran out, by when the step's last micro-batch may have started: in commit order
        # it comes right after the last unit it needs.
        (entry,) = [d for d in done if d[0] == units[target]]
        done.remove(entry)
        segment = table.segment(target)
        needs = {units[i] for i in [*segment.needs(target), *range(segment.start)]}
        done.insert(1 + max(n for n, (unit, _) in enumerate(done) if unit in needs), entry)
    assert_each_once_in_wavefront_order(done, table)
    assert completed_on(done, units[target]) != victim
    assert_trained_like_plain_pytorch(workers, "k", trial, tmp_path)
