"""The fault hook: parsed from the workers' environment, named points only, and it fires exactly once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from worker.config import ConfigError, load
from worker.engine.faults import REACHED, Fault


def test_it_is_read_from_the_workers_environment(tmp_path: Path) -> None:
    config = load({"HYDRA_FAULT": "mid-backward:oom@13", "HYDRA_FAULT_DIR": str(tmp_path)})
    assert config.fault == Fault(point="mid-backward", action="oom", unit=13, signal_dir=tmp_path)
    assert load({"HYDRA_FAULT": "mid-write", "HYDRA_FAULT_DIR": str(tmp_path)}).fault == Fault(
        point="mid-write", action="block", unit=None, signal_dir=tmp_path)
    assert load({}).fault is None  # off unless asked for


@pytest.mark.parametrize(("value", "message"), [
    ("mid-air", "'mid-air' is not one of before-compute"),
    ("mid-write:crash", "'crash' is not one of block, oom, exit"),
    ("mid-write@two", "the unit after '@' must be a timetable index"),
])
def test_it_refuses_what_it_does_not_know_naming_the_variable(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"HYDRA_FAULT={value!r}.*{message}"):
        load({"HYDRA_FAULT": value, "HYDRA_FAULT_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="HYDRA_FAULT_DIR is not"):
        load({"HYDRA_FAULT": "mid-write"})


def test_it_fires_once_at_its_point_of_its_unit(tmp_path: Path) -> None:
    fault = Fault(point="mid-step", action="oom", unit=3, signal_dir=tmp_path)
    fault.reach("mid-write", trial_id="t", unit=3)  # another point
    fault.reach("mid-step", trial_id="t", unit=2)  # another unit
    assert not (tmp_path / REACHED).exists()
    with pytest.raises(torch.OutOfMemoryError, match="out of memory at mid-step of unit 3"):
        fault.reach("mid-step", trial_id="t", unit=3)
    assert json.loads((tmp_path / REACHED).read_text()) == {
        "point": "mid-step", "action": "oom", "trial": "t", "unit": 3, "pid": os.getpid()}
    fault.reach("mid-step", trial_id="t", unit=3)  # the re-run passes
    assert sorted(p.name for p in tmp_path.iterdir()) == [REACHED]
