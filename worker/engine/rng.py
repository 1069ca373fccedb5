"""The global RNG state a unit runs under, as tensors the spill store can keep.

A trial's dropout draws from the process-global generators (CPU, and the device's on CUDA). Each micro-batch's
forward starts from generators seeded with :func:`micro_batch_seed` of the trial's seed, the step and the
micro-batch, as a plain training loop that calls ``torch.manual_seed(micro_batch_seed(...))`` before each
micro-batch's forward does; a shard's forward leaves the state it ended with for the next shard of the same
micro-batch. So the random numbers of a micro-batch depend on nothing that another micro-batch did, and the
micro-batches of one step may run on several devices at once (a wavefront) with the numbers of one device. The
session saves and restores the generators around units, so a caller's own RNG state is the same after a unit as
before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch


def rng_state(device: torch.device) -> list[torch.Tensor]:
    """The global RNG state that dropout on ``device`` draws from: CPU's, then the device's on CUDA."""
    if device.type == "cuda":
        return [torch.get_rng_state(), torch.cuda.get_rng_state(device)]
    return [torch.get_rng_state()]


def set_rng_state(raw: torch.Tensor, numel: list[int], device: torch.device) -> None:
    """Restore a state saved as the concatenated bytes of :func:`rng_state` (``numel``: their sizes)."""
    cpu = numel[0]
    torch.set_rng_state(raw[:cpu])
    if device.type == "cuda":
        torch.cuda.set_rng_state(raw[cpu:], device)


@contextlib.contextmanager
def caller_rng_kept(device: torch.device) -> Iterator[None]:
    """Units set the global RNG to their trial's stream; give the caller its own state back afterwards."""
    saved = rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        if device.type == "cuda":
            torch.cuda.set_rng_state(saved[1], device)


def micro_batch_seed(seed: int, step: int, micro_batch: int) -> int:
    """The seed of micro-batch ``micro_batch`` of optimizer step ``step`` of a trial seeded ``seed``: NumPy's
    ``SeedSequence`` of the three, so that nearby triples give unrelated streams."""
    return int(np.random.SeedSequence([seed, step, micro_batch]).generate_state(1, np.uint64)[0])


def seed_micro_batch(seed: int, step: int, micro_batch: int, device: torch.device) -> None:
    """Seed the generators ``device``'s dropout draws from as ``torch.manual_seed(micro_batch_seed(...))``
    seeds them (CPU's, and the device's on CUDA)."""
    value = micro_batch_seed(seed, step, micro_batch)
    torch.random.default_generator.manual_seed(value)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(value)
