"""LoRA adapters on a pretrained model, as the ``peft`` library defines them.

The layer stack injects ``peft``'s own LoRA modules into the meta model (``peft.inject_adapter_in_model``), so
a layer computes exactly what a ``PeftModel`` computes: the frozen base output plus
``lora_B(lora_A(dropout(x))) * alpha / r``. The adapters are the trial's trainable parameters (its store
holds them, their gradients and optimizer state); the base weights are frozen and read from the host's
shared copy (:mod:`worker.engine.shared_base`). Adapters start from ``peft``'s own initialization
(``LoraLayer.reset_lora_parameters``: Kaiming-uniform A, zero B), seeded per layer like the engine's
other inits so that a layer is initialized alone.

Exports are standard: ``adapter/`` is a PEFT adapter directory (``PeftModel.from_pretrained`` loads it on the
base), and the trial's export directory itself is the merged model, with ``peft``'s merge arithmetic
(``W + transpose(B @ A) * scaling``), so generation and evaluation load it like any other export.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from torch import nn

from worker.engine.config import LoraSpec
from worker.engine.errors import SpecError

ADAPTER = "default"  # the one adapter of a trial; PEFT drops this name from the keys it saves
ADAPTER_DIR = "adapter"  # the PEFT adapter's directory inside the trial's export


def lora_config(spec: LoraSpec, *, family: str, base_dir: str | None = None) -> LoraConfig:
    """``peft``'s config of ``spec`` (GPT-2's fused projections are ``Conv1D``: fan-in/fan-out weights)."""
    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.target_modules), fan_in_fan_out=family == "gpt2", bias="none",
                      task_type="CAUSAL_LM", base_model_name_or_path=base_dir)


def inject(model: nn.Module, spec: LoraSpec) -> None:
    """Put ``peft``'s LoRA modules into ``model`` (on the meta device: no memory) in place."""
    config = lora_config(spec, family=model.config.model_type)
    with torch.random.fork_rng(devices=[]):  # peft initializes while injecting; the caller's stream stays
        try:
            inject_adapter_in_model(config, model)
        except ValueError as error:  # peft: "Target modules {...} not found in the base model"
            raise SpecError(f"LoRA target_modules {list(spec.target_modules)}: {error}") from None


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` (of a layer or of the model) is a LoRA adapter weight."""
    return ".lora_A." in f".{name}" or ".lora_B." in f".{name}"


def base_name(hf_name: str) -> str:
    """The checkpoint's name of a frozen base weight, from its name in the model with adapters injected."""
    return hf_name.replace(".base_layer.", ".")


def peft_key(hf_name: str) -> str:
    """The key PEFT saves an adapter weight under in ``adapter_model.safetensors``."""
    return "base_model.model." + hf_name.replace(f".{ADAPTER}.", ".")


def lora_modules(module: nn.Module) -> list[tuple[str, LoraLayer]]:
    """The LoRA-wrapped modules of ``module``, in module order, with their names."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapters_off(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Within the block, the LoRA layers of `modules` compute their base layer alone: what ``peft``'s
    ``PeftModel.disable_adapter()`` does, module by module (``enable_adapters``), for a DPO trial's reference."""
    layers = [layer for module in modules for _, layer in lora_modules(module)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def init_adapters(layer: nn.Module, seed: int) -> None:
    """Initialize the (bound, real) adapter weights of ``layer`` in module order with ``peft``'s own
    ``reset_lora_parameters``, from RNG seed ``seed``; the caller's RNG stream is left untouched."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for _, module in lora_modules(layer):
            module.reset_lora_parameters(ADAPTER, True)


def merged(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, *, scaling: float,
           fan_in_fan_out: bool) -> torch.Tensor:
    """``weight`` with the adapter merged in, with ``peft``'s arithmetic (``LoraLayer.get_delta_weight`` and
    ``merge``): ``weight + transpose(B @ A) * scaling``."""
    delta = lora_b @ lora_a
    if fan_in_fan_out:
        delta = delta.T
    return weight + delta * scaling


def write_adapter(out_dir: Path, *, spec: LoraSpec, family: str, base_dir: str | None,
                  adapters: dict[str, torch.Tensor]) -> None:
    """A PEFT adapter directory: ``adapter_config.json`` and ``adapter_model.safetensors`` (``adapters``:
    the trained weights under their names in the model with adapters injected)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lora_config(spec, family=family, base_dir=base_dir).save_pretrained(out_dir)
    save_file({peft_key(name): tensor.contiguous() for name, tensor in adapters.items()},
              out_dir / "adapter_model.safetensors", metadata={"format": "pt"})


def target_of(hf_name: str) -> str:
    """The wrapped module's name of an adapter weight (``...q_proj.lora_A.default.weight`` -> ``...q_proj``)."""
    match = re.match(rf"(.*)\.lora_[AB]\.{ADAPTER}\.weight$", hf_name)
    if match is None:
        raise AssertionError(f"{hf_name} is not a LoRA weight")
    return match.group(1)
