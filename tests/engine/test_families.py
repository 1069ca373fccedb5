"""Every family the engine trains: its parameter counts, adapter, exact sharded training and export.

Tiny random configs built locally (no hub), so each case takes seconds.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from worker.engine.errors import SpecError
from worker.engine.families import FAMILIES, UnknownArchitecture, architecture_from_config

# One tiny config per family; grouped-query attention where the family has it (2 kv heads for 4 heads).
TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 96, "n_positions": 32},
    **{family: {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 48, "vocab_size": 96, "max_position_embeddings": 32}
       for family in ("llama", "mistral", "qwen2", "qwen3")},
}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen3-head-dim": ("qwen3", {"head_dim": 16}),  # heads x head_dim != hidden
    "qwen3-default-head-dim": ("qwen3", {"attention_bias": True}),  # no head_dim: transformers' 128
    "mistral-mha": ("mistral", {"num_key_value_heads": 4}),
}


def real_model(model_type: str, **fields: Any) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def counts_match(model: torch.nn.Module) -> None:
    arch = architecture_from_config(model.config.to_dict())
    assert arch.architecture == type(model).__name__
    assert arch.n_params == sum(p.numel() for p in model.parameters())
    layers = arch.layer_params()
    assert [name for name, _, _ in layers] == ["embedding", *(f"block.{i}" for i in range(arch.n_layer)), "head"]
    blocks = model.transformer.h if arch.family == "gpt2" else model.model.layers
    for (_, owned, _), block in zip(layers[1:-1], blocks, strict=True):
        assert owned == sum(p.numel() for p in block.parameters())
    lm_head = model.get_output_embeddings().weight.numel()
    assert layers[-1][2] == (lm_head if arch.tied else 0)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_its_parameter_counts_are_the_real_models(family: str, tied: bool) -> None:
    counts_match(real_model(family, **TINY[family], tie_word_embeddings=tied))


@pytest.mark.parametrize("variant", VARIANTS)
def test_its_parameter_counts_follow_each_familys_options(variant: str) -> None:
    family, extra = VARIANTS[variant]
    counts_match(real_model(family, **{**TINY[family], **extra}))


def test_it_names_an_architecture_it_does_not_know() -> None:
    with pytest.raises(UnknownArchitecture, match="architecture 'FooForCausalLM' \\(model_type 'foo'\\) is not "
                       "supported; supported: gpt2, llama, mistral, qwen2, qwen3"):
        architecture_from_config({"model_type": "foo", "architectures": ["FooForCausalLM"], "hidden_size": 8})
    assert issubclass(UnknownArchitecture, SpecError)
    arch = architecture_from_config({**TINY["llama"], "architectures": ["LlamaForCausalLM"]})  # no model_type
    assert arch.family == "llama"
    with pytest.raises(SpecError, match="hidden_size"):
        architecture_from_config({"model_type": "qwen2", "num_hidden_layers": 2})
