"""The global RNG state a unit runs under, as tensors the spill store can keep.

A trial's dropout draws from the process-global generators (CPU, and the device's on CUDA). The session
saves and restores their states around units, so a unit's random numbers depend only on the store, and a
caller's own RNG state is the same after a unit as before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


def initial_rng(seed: int, device: torch.device) -> list[torch.Tensor]:
    """The RNG state right after ``torch.manual_seed(seed)``: where plain training's dropout starts."""
    states = [torch.Generator().manual_seed(seed).get_state()]
    if device.type == "cuda":
        states.append(torch.Generator(device=device).manual_seed(seed).get_state())
    return states
