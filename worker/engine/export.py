"""A trial's committed weights as a transformers ``save_pretrained`` directory (safetensors).

What is written loads with ``GPT2LMHeadModel.from_pretrained`` to the model the store holds: every
owned parameter under its transformers name, tied weights once (transformers re-ties them). One
safetensors file per shard plus an index, so only one shard's parameters are in memory at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from worker.engine.layers import LayerStack
from worker.engine.layout import Layout
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore


def export_pretrained(out_dir: Path, *, store: SpillStore, stack: LayerStack, layout: Layout,
                      after_file: Callable[[], None] = lambda: None) -> None:
    """Write the parameters committed in ``store`` (laid out as ``layout``) and ``stack``'s config to
    ``out_dir``; ``after_file`` is called after each shard's file is written (a fault point)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stack.config.save_pretrained(out_dir)
    n = len(layout.slots)
    weight_map: dict[str, str] = {}
    total = 0
    for shard in range(n):
        filename = "model.safetensors" if n == 1 else f"model-{shard + 1:05d}-of-{n:05d}.safetensors"
        flat = store.read_new(f"p{shard}", layout.numel[shard], torch.float32)
        tensors = {}
        for slot in layout.slots[shard]:
            name = stack.hf_name(slot.ref)
            tensors[name] = slot.view(flat).clone()
            weight_map[name] = filename
        total += flat.numel() * FP32
        save_file(tensors, out_dir / filename, metadata={"format": "pt"})
        after_file()
    if n > 1:
        (out_dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
