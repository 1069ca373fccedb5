"""The engine runner's durable checkpoints in this process: when they are taken, what each trial keeps, and
how they are reported (the wiped spill directory on real workers: test_reboot.py)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob
from worker.engine import durable
from worker.scheduling.engine_runner import EngineRunner
from worker.scheduling.runner import UnitDone, WorkloadError

CPU = torch.device("cpu")


def run(runner: EngineRunner, trial_id: str, job: EngineJob, units: int) -> UnitDone:
    out = None
    for i in range(units):
        out = runner.run_unit(trial_id=trial_id, job=job, units_done=i, next_trial=None, token=1)
        assert isinstance(out, UnitDone)
    assert out is not None
    return out


def test_checkpoints_follow_the_jobs_interval_and_each_is_reported_once(tokens: str, tmp_path: Path) -> None:
    runner = EngineRunner(spill_dir=tmp_path / "spill", device=CPU, checkpoint_dir=tmp_path / "checkpoints")
    often = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3, steps=2), checkpoint_minutes=1e-6)
    never = EngineJob(trial=tiny_trial(tokens, seed=1, lr=1e-3, steps=2), checkpoint_minutes=0)
    rarely = EngineJob(trial=tiny_trial(tokens, seed=2, lr=1e-3, steps=2))  # the default: 30 minutes
    units = {}
    for trial_id, job in (("often", often), ("never", never), ("rarely", rarely)):
        units[trial_id] = runner.plan(trial_id=trial_id, job=job).remaining_units
        run(runner, trial_id, job, 3)
    runner.wait_for_checkpoints()
    reported = runner.checkpoints()
    assert {c.trial for c in reported} == {"often"} and len(reported) >= 1
    assert runner.checkpoints() == []  # each is reported once
    newest = durable.latest(tmp_path / "checkpoints", "often")
    assert newest is not None and newest.cursor <= 3 and newest.bytes == reported[-1].bytes

    # Ending: a finished trial keeps its last checkpoint (its whole state) beside its export, the others none.
    for trial_id, job in (("often", often), ("never", never), ("rarely", rarely)):
        run(runner, trial_id, job, units[trial_id] - 3)
        runner.export(trial_id=trial_id, job=job, export_dir=str(tmp_path / "exports" / trial_id))
    runner.wait_for_checkpoints()
    last = {c.trial: c for c in runner.checkpoints()}
    assert last["often"].step == last["rarely"].step == 2 and "never" not in last
    assert not (tmp_path / "checkpoints" / "never").exists()
    assert os.listdir(tmp_path / "spill") == []  # stores freed, and the snapshots' links with their copies
    final = durable.latest(tmp_path / "checkpoints", "rarely")
    assert final is not None and final.cursor == units["rarely"]


def test_a_trial_whose_store_is_gone_goes_on_from_its_checkpoint_or_fails_saying_why(
    tokens: str, tmp_path: Path
) -> None:
    runner = EngineRunner(spill_dir=tmp_path / "spill", device=CPU, checkpoint_dir=tmp_path / "checkpoints")
    kept = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3, steps=2), checkpoint_minutes=1e-6)
    lost = EngineJob(trial=tiny_trial(tokens, seed=1, lr=1e-3, steps=2), checkpoint_minutes=0)
    for trial_id, job in (("kept", kept), ("lost", lost)):
        runner.plan(trial_id=trial_id, job=job)
        run(runner, trial_id, job, 4)
    other = EngineRunner(spill_dir=tmp_path / "spill", device=CPU, checkpoint_dir=tmp_path / "checkpoints")
    run(other, "kept", kept, 1)  # another device, whose session of the trial is cached
    run(runner, "kept", kept, 2)  # past the checkpoint: work the reboot loses
    seen = runner._sessions["kept"].store.commit_version
    runner.wait_for_checkpoints()
    other.wait_for_checkpoints()
    checkpoint = durable.latest(tmp_path / "checkpoints", "kept")
    assert checkpoint is not None
    shutil.rmtree(tmp_path / "spill")  # the reboot

    out = run(runner, "kept", kept, 1)
    session = runner._sessions["kept"]
    assert (out.step, session.cursor) == (session.timetable[checkpoint.cursor].step, checkpoint.cursor + 1)
    # The restored store numbers its commits above every version the lost one used, so a device that saw
    # the lost store (its reads are keyed by buffer version) cannot take a new file for one it read.
    assert runner._sessions["kept"].store.commit_version > seen
    run(other, "kept", kept, 1)
    assert other._sessions["kept"].cursor == checkpoint.cursor + 2
    with pytest.raises(WorkloadError, match=re.escape("the spill store of trial lost is gone (host restarted?) and "
                                                      "it has no checkpoint")):
        run(runner, "lost", lost, 1)
    left_behind = tmp_path / "spill" / durable.SNAPSHOTS / "kept"  # a process killed while checkpointing
    left_behind.mkdir(parents=True, exist_ok=True)
    (left_behind / "p0@3.bin").write_bytes(b"held")
    runner.discard(trial_id="kept")
    assert not (tmp_path / "checkpoints" / "kept").exists()  # a trial that ended otherwise keeps none
    assert not left_behind.exists() and not (tmp_path / "spill" / "kept").exists()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores")
def test_checkpoint_copies_run_on_the_host_cores_not_only_the_devices(tokens: str, tmp_path: Path) -> None:
    """A CPU device's worker is pinned to its core; its checkpoint copies (host work) may use every core of the
    host, so that a copy does not take the device's core while another idles."""
    host = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(host)})  # as the device worker pins itself
        runner = EngineRunner(spill_dir=tmp_path / "spill", device=CPU, checkpoint_dir=tmp_path / "checkpoints",
                              host_cores=sorted(host))
        job = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3, steps=1), checkpoint_minutes=1e-6)
        units = runner.plan(trial_id="t", job=job).remaining_units
        run(runner, "t", job, units)
        runner.export(trial_id="t", job=job, export_dir=str(tmp_path / "export"))
        assert runner._writer.submit(os.sched_getaffinity, 0).result() == host
        assert os.sched_getaffinity(0) == {min(host)}  # the device's own thread stays on its core
        assert durable.latest(tmp_path / "checkpoints", "t") is not None
    finally:
        os.sched_setaffinity(0, host)
