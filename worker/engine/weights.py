"""Where a layer's initial weights come from: the family's own seeded init or a local pretrained checkpoint.

Both produce one layer at a time (CPU, fp32), so a model is initialized straight into the spill store
without ever existing whole in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from worker.engine import lora
from worker.engine.checkpoint_files import checkpoint_dir, checkpoint_file, read_json
from worker.engine.errors import SpecError
from worker.engine.layers import LayerStack


def layer_seed(seed: int, index: int) -> int:
    """The RNG seed of layer ``index``'s init: independent streams so layers can be made one at a time."""
    return (seed * 1_000_003 + index) % (1 << 63)


def _post_order(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    for name, child in module.named_children():
        yield from _post_order(child, f"{prefix}{name}.")
    yield prefix.removesuffix("."), module


def init_layer(stack: LayerStack, index: int, seed: int) -> list[torch.Tensor]:
    """Layer ``index``'s owned parameters, initialized by the model's own ``_init_weights``.

    Modules are visited children-first like ``nn.Module.apply`` (so GPT-2's scaled ``c_proj`` init
    overrides the generic one, as in transformers); modules that register a borrowed parameter are
    skipped, since the owner initializes it. With LoRA adapters the owned parameters are the adapters,
    initialized by ``peft`` (:func:`worker.engine.lora.init_adapters`). The caller's RNG is left untouched.
    """
    borrowed_modules = {b.name.rpartition(".")[0] for b in stack.borrowed[index]}
    layer = stack.layers[index]
    tensors = [torch.empty(ref.shape) for ref in stack.owned[index]]
    for ref, tensor in zip(stack.owned[index], tensors, strict=True):
        stack.bind(index, ref.name, tensor)
    if stack.adapters:
        lora.init_adapters(layer, layer_seed(seed, index))
        stack.release(index, index + 1)
        return tensors
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(layer_seed(seed, index))
        for name, module in _post_order(layer):
            if name not in borrowed_modules:
                stack.model._init_weights(module)
    stack.release(index, index + 1)
    return tensors


class PretrainedWeights:
    """Reads single tensors from a local safetensors checkpoint (one file or an indexed set of files).

    The directory is named by its real path and its files are its own (`worker.engine.checkpoint_files`):
    a symbolic link swapped in since the checkpoint was checked raises ``CheckpointLinkError``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = checkpoint_dir(directory)
        index = checkpoint_file(self.directory, "model.safetensors.index.json")
        if index.exists():
            content = read_json(index)
            weight_map = content.get("weight_map") if isinstance(content, dict) else None
            if not isinstance(weight_map, dict):
                raise SpecError(f"{index} is not a safetensors index (no weight_map)")
            paths = {name: checkpoint_file(self.directory, name) for name in {str(n) for n in weight_map.values()}}
            self.files: dict[str, Path] = {key: paths[str(name)] for key, name in weight_map.items()}
        elif (single := checkpoint_file(self.directory, "model.safetensors")).exists():
            with safe_open(single, framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), single)
        else:
            raise SpecError(f"{directory} has no model.safetensors; only safetensors checkpoints are read")

    def get(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (a key of the family's ``*ForCausalLM``; GPT-2 checkpoints without the ``transformer.``
        prefix work)."""
        for key in (name, name.removeprefix("transformer.")):
            if key in self.files:
                with safe_open(self.files[key], framework="pt") as f:
                    return f.get_tensor(key).to(torch.float32)
        raise SpecError(f"{self.directory} has no tensor {name!r}")

    def layer(self, stack: LayerStack, index: int) -> list[torch.Tensor]:
        """Layer ``index``'s owned parameters from the checkpoint."""
        tensors = []
        for ref, name in zip(stack.owned[index], stack.hf_names(stack.owned[index]), strict=True):
            tensor = self.get(name)
            if tuple(tensor.shape) != ref.shape:
                raise SpecError(f"{name} has shape {tuple(tensor.shape)}, the config says {ref.shape}")
            tensors.append(tensor)
        return tensors
