"""Which devices a host offers, and how a worker is pinned to one."""

from __future__ import annotations

import pytest

from worker.devices import Device, cpu_cores, devices_from_spec
from worker.launch import worker_command


def test_it_uses_every_gpu_when_there_are_some():
    assert devices_from_spec("auto", cuda_count=2, cpu_count=16) == [Device("cuda", 0, 8), Device("cuda", 1, 8)]


def test_it_falls_back_to_two_cpu_devices_sharing_the_cores():
    assert devices_from_spec("auto", cuda_count=0, cpu_count=2) == [Device("cpu", 0, 1), Device("cpu", 1, 1)]
    assert devices_from_spec("auto", cuda_count=0, cpu_count=1) == [Device("cpu", 0, 1)]


def test_it_honours_an_explicit_cpu_count():
    assert devices_from_spec("cpu:3", cuda_count=4, cpu_count=12) == [Device("cpu", i, 4) for i in range(3)]


def test_it_selects_named_gpus_and_refuses_missing_ones():
    assert [d.index for d in devices_from_spec("cuda:1,0", cuda_count=2, cpu_count=4)] == [0, 1]
    with pytest.raises(ValueError, match="names GPU \\[3\\]"):
        devices_from_spec("cuda:3", cuda_count=2, cpu_count=4)
    with pytest.raises(ValueError, match="no GPU"):
        devices_from_spec("cuda", cuda_count=0, cpu_count=4)


def test_it_gives_each_cpu_device_its_own_run_of_cores():
    assert [cpu_cores(i, 1, [0, 1]) for i in range(2)] == [[0], [1]]
    assert [cpu_cores(i, 4, list(range(12))) for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert cpu_cores(1, 2, [2, 5, 7, 9]) == [7, 9]  # the cores this process may use, not 0..n-1
    assert [cpu_cores(i, 1, [0, 1]) for i in range(3)] == [[0], [1], [0]]  # more devices than cores: shared
    with pytest.raises(ValueError, match="no core"):
        cpu_cores(0, 1, [])


def test_it_pins_a_gpu_worker_with_cuda_visible_devices():
    env = Device("cuda", 1, 4).worker_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["HYDRA_WORKER_DEVICE"] == "cuda:1"
    assert env["OMP_NUM_THREADS"] == "4"
    assert "CUDA_VISIBLE_DEVICES" not in Device("cpu", 0, 2).worker_env()
    assert Device("cpu", 0, 2).worker_env()["MKL_DISABLE_FAST_MM"] == "1"  # MKL's pool is outside the budget


def test_it_starts_one_single_process_worker_named_after_device_and_host():
    command = worker_command(Device("cpu", 1, 1), "lab7", loglevel="INFO")
    assert command[command.index("--hostname") + 1] == "cpu1@lab7"
    assert command[command.index("--concurrency") + 1] == "1"
    assert "hydra.lab7.cpu1" in command[command.index("--queues") + 1].split(",")
