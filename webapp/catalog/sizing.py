"""How big a checkpoint's training state is, and where it fits on this host's devices.

The training state is what the engine keeps per parameter in fp32 (`worker.engine.sizes`): the parameters,
their gradients and the optimizer's slots (AdamW two moments, SGD with momentum one). A checkpoint is
*resident* on a device whose budget holds its whole training state, and *spilled* (sharded, its shards taking
turns on the device) when the budget holds what the engine's smallest shard needs (`smallest_budget`): its
largest layer's weights and gradients (`worker.engine.families` counts the layers; the optimizer state and the
accumulated gradients stream through in chunks, and a head whose loss runs in chunks holds a tied weight without
its gradient) and as much again for the prefetch of the next shard. Activations come on top and depend on the
batch, so the experiment form's memory preview plans those.

Devices are the device workers of this host whose device loops are alive, as they answer the health page's
broadcast (`webapp.queue_client`); a GPU's budget is the share of its memory a trial plans for
(`AUTO_BUDGET_FRACTION`), read through NVML; a CPU device's is the web app's default budget for one. A
checkpoint whose directory a symbolic link now leads out of the models root (or one of whose files out of the
directory) fits nowhere (`UNAVAILABLE`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.template.defaultfilters import filesizeformat

from webapp.catalog.models import Checkpoint
from webapp.catalog.paths import registered_dir
from webapp.health.selectors import workers_online
from webapp.worker_door import (
    AUTO_BUDGET_FRACTION,
    BASE_DTYPES,
    CHECKPOINT_JSON_MAX_BYTES,
    FP32,
    SpecError,
    architecture_from_config,
    checkpoint_file,
    optimizer_slots,
    read_limited,
)

CPU_DEVICE_BUDGET = 4 << 30  # per CPU device when no GPU is present (the memory preview's "auto" too)
# What the catalog sizes the training state for: (label, optimizer kind, momentum).
OPTIMIZERS = (("AdamW", "adamw", 0.0), ("SGD with momentum", "sgd", 0.9))
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class DeviceBudget:
    device: str  # "cuda:0", "cpu:1"
    budget_bytes: int | None  # None: the GPU's memory could not be read
    note: str


@dataclass(frozen=True)
class Fit:
    optimizer: str
    state_bytes: int  # parameters + gradients + optimizer slots, fp32
    verdict: str  # "resident", "spilled", "too large", "fit unknown", UNAVAILABLE
    detail: str


def smallest_budget(largest_layer_params: int) -> int:
    """The least device memory a spilled trial of a model whose largest layer has ``largest_layer_params``
    parameters needs before activations: that layer's fp32 weights and fresh gradients while its unit runs,
    plus the prefetch reserve for them (the engine's `Bytes.device_bytes` and partition solver)."""
    return 2 * 2 * largest_layer_params * FP32


def state_bytes(n_params: int, *, optimizer: str, momentum: float) -> int:
    """Bytes of `n_params` parameters' training state under the optimizer: fp32 values, gradients, slots."""
    return n_params * FP32 * (2 + optimizer_slots(optimizer, momentum))


def base_sizes(checkpoint: Checkpoint) -> list[tuple[str, int]]:
    """The host bytes of the checkpoint's shared LoRA base in each precision it may be kept in (the engine's
    `Architecture.base_bytes`, from its config); [] when its config cannot be read now."""
    try:
        directory = registered_dir(checkpoint.path)
        config = json.loads(read_limited(checkpoint_file(directory, "config.json"), limit=CHECKPOINT_JSON_MAX_BYTES))
        architecture = architecture_from_config(config)
    except (ValidationError, OSError, ValueError, SpecError):
        return []
    return [(base_dtype, architecture.base_bytes(base_dtype)) for base_dtype in BASE_DTYPES]


def host_devices() -> list[DeviceBudget]:
    """The devices of this host's workers that answered, with their budgets; [] when none did (or Redis is
    down)."""
    host = settings.HYDRA.worker.host_id
    names = sorted({w.device for w in workers_online(live_only=True) if w.device and w.host in (host, None)},
                   key=lambda name: (name.split(":")[0], int(name.split(":")[1]) if ":" in name else 0))
    return [_budget(name) for name in names]


def _budget(device: str) -> DeviceBudget:
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return DeviceBudget(device, CPU_DEVICE_BUDGET, "a CPU device's default budget")
    try:
        import pynvml
    except ImportError:
        return DeviceBudget(device, None, "its memory could not be read (no NVML library)")
    try:
        pynvml.nvmlInit()
        try:
            total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(int(index or 0))).total
        finally:
            pynvml.nvmlShutdown()
    except (pynvml.NVMLError, ValueError) as error:
        return DeviceBudget(device, None, f"its memory could not be read ({error})")
    return DeviceBudget(device, int(total * AUTO_BUDGET_FRACTION), f"{AUTO_BUDGET_FRACTION:.0%} of its memory")


def fits(checkpoint: Checkpoint, devices: Iterable[DeviceBudget]) -> list[Fit]:
    """For each optimizer of `OPTIMIZERS`: the ready checkpoint's training state and where it fits; nowhere
    (`UNAVAILABLE`, the detail saying why) when its directory fails `registered_dir` now."""
    try:
        registered_dir(checkpoint.path)
    except ValidationError as error:
        reason = " ".join(error.messages)
    else:
        reason = ""
    answered = list(devices)
    devices = [d for d in answered if d.budget_bytes is not None]
    unknown = "no device's memory could be read" if answered else "no device worker of this host answered"
    n_params = checkpoint.n_params or 0
    result = []
    for label, kind, momentum in OPTIMIZERS:
        total = state_bytes(n_params, optimizer=kind, momentum=momentum)
        layer = (smallest_budget(checkpoint.largest_layer_params)
                 if checkpoint.largest_layer_params is not None else None)
        result.append(Fit(label, total, UNAVAILABLE, reason) if reason else
                      _fit(label, total, layer, devices, unknown))
    return result


def _fit(label: str, total: int, layer: int | None, devices: list[DeviceBudget], unknown: str) -> Fit:
    if not devices:
        return Fit(label, total, "fit unknown", unknown)
    resident = [d.device for d in devices if d.budget_bytes is not None and total <= d.budget_bytes]
    if resident:
        return Fit(label, total, "resident", "whole on " + ", ".join(resident))
    if layer is None:
        return Fit(label, total, "spilled", "sharded, its shards taking turns on " + ", ".join(
            d.device for d in devices))
    spilled = [d.device for d in devices if d.budget_bytes is not None and layer <= d.budget_bytes]
    needs = f"from {filesizeformat(layer)} of device memory plus activations"
    if spilled:
        return Fit(label, total, "spilled", f"sharded, its shards taking turns on {', '.join(spilled)}; {needs}")
    largest = max(devices, key=lambda d: d.budget_bytes or 0)
    return Fit(label, total, "too large",
               f"its largest layer needs {filesizeformat(layer)} with the prefetch of the next, over "
               f"{largest.device}'s budget, the largest here")
