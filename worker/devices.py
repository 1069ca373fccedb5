"""Which devices this host has, and how a worker process is bound to one.

`devices_from_spec` is pure (tests give it counts); `host_devices` asks the machine. CUDA GPUs are
counted through NVML so that the launcher never initialises CUDA itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Device:
    kind: Literal["cpu", "cuda"]
    index: int
    threads: int

    @property
    def spec(self) -> str:
        """``cpu:0`` / ``cuda:1``: the value of HYDRA_WORKER_DEVICE for this device's worker."""
        return f"{self.kind}:{self.index}"

    @property
    def name(self) -> str:
        """``cpu0`` / ``cuda1``: used in worker node names and queue names."""
        return f"{self.kind}{self.index}"

    def worker_env(self) -> dict[str, str]:
        """Environment that pins a worker process to this device."""
        env = {
            "HYDRA_WORKER_DEVICE": self.spec,
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
        }
        if self.kind == "cpu":
            # A CPU device's memory is the host's: MKL's own pool of freed buffers would hold tens of MB
            # outside the trial's budget for the life of the process (benchmarks/memory_bound.py).
            env["MKL_DISABLE_FAST_MM"] = "1"
        if self.kind == "cuda":
            # NVML numbers GPUs by PCI bus; make CUDA agree so the index means the same card.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = str(self.index)
        return env


def worker_node(device: str, host_id: str) -> str:
    """The Celery node name of `device`'s worker on `host_id` (``cpu0@lab-gpu-1``): what a broadcast names."""
    return f"{device}@{host_id}"


def device_queue(host_id: str, device: str) -> str:
    """The Celery queue that only `device`'s worker on `host_id` consumes."""
    return f"hydra.{host_id}.{device}"


def host_queue_name(host_id: str) -> str:
    """The Celery queue every device worker of `host_id` consumes."""
    return f"hydra.{host_id}"


def devices_from_spec(spec: str, *, cuda_count: int, cpu_count: int) -> list[Device]:
    """Expand a HYDRA_DEVICES value (already validated by settings) into devices.

    ``auto`` means every GPU, or two CPU devices sharing the cores when there is no GPU (one when the
    machine has a single core). ``cpu:N`` gives N CPU devices with an equal share of the cores each.
    ``cuda`` is every GPU; ``cuda:0,2`` those GPUs. Asking for a GPU the host lacks raises ValueError.
    """
    if spec == "auto":
        spec = "cuda" if cuda_count > 0 else f"cpu:{2 if cpu_count >= 2 else 1}"
    if spec.startswith("cpu:"):
        count = int(spec.removeprefix("cpu:"))
        threads = max(1, cpu_count // count)
        return [Device("cpu", index, threads) for index in range(count)]
    threads = max(1, cpu_count // max(1, cuda_count))
    indices = list(range(cuda_count)) if spec == "cuda" else [int(i) for i in spec.removeprefix("cuda:").split(",")]
    missing = [i for i in indices if i >= cuda_count]
    if missing:
        raise ValueError(f"HYDRA_DEVICES={spec!r} names GPU {missing}, but this host has {cuda_count} GPU(s).")
    if not indices:
        raise ValueError(f"HYDRA_DEVICES={spec!r} found no GPU on this host; use cpu:N instead.")
    return [Device("cuda", index, threads) for index in sorted(set(indices))]


def cpu_cores(index: int, threads: int, available: Sequence[int]) -> list[int]:
    """The cores CPU device ``index`` of ``threads`` threads is pinned to, out of the ``available`` ones:
    the ``index``-th run of ``threads`` cores, wrapping around when devices outnumber cores.

    Pinned, a device's thread stays on its core and keeps its caches: units that hop between devices then
    cost less (benchmarks/RESULTS.md has benchmarks/sharp_scaling.py with and without pinning)."""
    if not available:
        raise ValueError("no core is available to pin a CPU device to")
    return sorted({available[(index * threads + k) % len(available)] for k in range(threads)})


def cuda_device_count() -> int:
    """Number of NVIDIA GPUs visible through NVML (0 when there is no driver)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def host_devices(spec: str) -> list[Device]:
    """The devices of this host for a HYDRA_DEVICES value."""
    return devices_from_spec(spec, cuda_count=cuda_device_count(), cpu_count=os.cpu_count() or 1)
