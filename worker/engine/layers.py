"""Layer adapter: a transformers causal LM of a supported family as an ordered list of layers on the meta device.

The contract every layer follows: layer 0 maps ``input_ids`` (B, T) to hidden states (B, T, C); middle
layers map (B, T, C) to (B, T, C); the last layer maps (hidden (B, T, C), labels (B, T)) to the scalar
mean causal-LM loss. Each layer runs the model's own submodules with the exact ops of the model's
``forward`` so that a layer-by-layer run is bit-identical to the whole model.

GPT-2's layers are here; the rotary families' (Llama, Mistral, Qwen2, Qwen3) are in
:mod:`worker.engine.rotary_layers`; the head that every family ends with is :mod:`worker.engine.head`. A family
without an adapter is refused by name before anything is built.

Parameter ownership is derived by identity: the first layer that registers a parameter owns it; a later
layer that registers the same tensor (GPT-2's ``lm_head.weight`` is ``wte.weight``) *borrows* it. Owned
parameters are stored, clipped and stepped once; a borrower's gradient is summed into its owner's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, GPT2Config, PretrainedConfig
from transformers.masking_utils import create_causal_mask

from worker.engine import lora as lora_adapters
from worker.engine.config import LoraSpec, ModelSpec
from worker.engine.families import CAUSAL_LM_CLASSES, architecture_from_config, default_intermediate, read_config
from worker.engine.head import CausalLMHead
from worker.engine.positions import Positions
from worker.engine.rotary_layers import rotary_layers
from worker.engine.sizes import tensor_format


class GPT2Embedding(nn.Module):
    """Token + position embeddings and embedding dropout: input_ids (B, T) -> hidden (B, T, C)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Dropout, positions: Positions) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop
        self.positions = positions

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        inputs_embeds = self.wte(input_ids)  # (B, T, C)
        hidden = inputs_embeds + self.wpe(self.positions.of(inputs_embeds))
        return self.drop(hidden)


class GPT2BlockLayer(nn.Module):
    """One transformer block with the causal mask ``GPT2Model`` would build: (B, T, C) -> (B, T, C)."""

    def __init__(self, block: nn.Module, config: GPT2Config, positions: Positions) -> None:
        super().__init__()
        self.block = block
        self.config = config
        self.positions = positions

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        position_ids = self.positions.of(hidden)  # (1, T), or (B, T) for packed rows
        mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=position_ids
        )
        return self.block(hidden, None, mask, None, encoder_attention_mask=None, use_cache=False,
                          position_ids=position_ids)


@dataclass(frozen=True)
class ParamRef:
    """A parameter as the engine stores it: owned by ``layer`` under ``name``, with its shape."""

    layer: int
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class FrozenRef:
    """A frozen base weight of a LoRA trial: registered by ``layer`` under ``name``, read from the shared
    base (:mod:`worker.engine.shared_base`) under ``key``, its name in the checkpoint (a tied weight has the
    one key of its first registration, so it is stored once). ``vocabulary``: the model's token embedding or
    output head matrix (a row per token), which a low-bit base may keep at a wider precision."""

    layer: int
    name: str
    shape: tuple[int, ...]
    key: str
    vocabulary: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def stored_as(self, base_dtype: str) -> str:
        """Its precision in a base stored at ``base_dtype`` (:func:`worker.engine.sizes.tensor_format`)."""
        return tensor_format(self.shape, base_dtype, vocabulary=self.vocabulary)


@dataclass(frozen=True)
class Borrow:
    """Layer ``layer`` registers, under ``name``, the parameter ``owner`` of an earlier layer."""

    layer: int
    name: str
    owner: ParamRef


class LayerStack:
    """A model as ordered layers on the meta device, with owned and borrowed parameters per layer.

    ``model`` keeps the meta skeleton alive (layers are views into it); nothing here holds real weights.
    With LoRA adapters injected (``adapters``), only the adapters are owned (trained and stored by the
    trial); every other parameter is a :class:`FrozenRef` of the layer's ``frozen`` list.
    """

    def __init__(self, model: nn.Module, *, adapters: bool = False) -> None:
        self.model = model
        self.adapters = adapters
        self.config: PretrainedConfig = model.config
        self.family: str = model.config.model_type
        self.positions = Positions()  # the position ids of the batch the layers run on, set per unit
        if self.family == "gpt2":
            transformer = model.transformer
            self.layers: list[nn.Module] = [
                GPT2Embedding(transformer.wte, transformer.wpe, transformer.drop, self.positions),
                *(GPT2BlockLayer(block, model.config, self.positions) for block in transformer.h),
                CausalLMHead(transformer.ln_f, model.lm_head, model.config.vocab_size, norm_name="ln_f"),
            ]
            self.names: list[str] = ["embedding", *(f"block.{i}" for i in range(len(transformer.h))), "head"]
        else:
            self.layers, self.names = rotary_layers(model, self.positions)
        self.owned: list[list[ParamRef]] = []
        self.borrowed: list[list[Borrow]] = []
        self.frozen: list[list[FrozenRef]] = []
        seen: dict[int, ParamRef] = {}
        model_names = {id(p): n for n, p in model.named_parameters()} if adapters else {}
        # the model's own word: its input embeddings and its output head (a LoRA-wrapped head's base weight)
        vocabulary = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings())
                      if m is not None}
        for index, layer in enumerate(self.layers):
            owned: list[ParamRef] = []
            borrowed: list[Borrow] = []
            frozen: list[FrozenRef] = []
            for name, param in layer.named_parameters():
                if adapters and not lora_adapters.is_adapter(name):
                    key = lora_adapters.base_name(model_names[id(param)])
                    frozen.append(FrozenRef(index, name, tuple(param.shape), key, id(param) in vocabulary))
                elif id(param) in seen:
                    borrowed.append(Borrow(index, name, seen[id(param)]))
                else:
                    ref = ParamRef(index, name, tuple(param.shape))
                    seen[id(param)] = ref
                    owned.append(ref)
            self.owned.append(owned)
            self.borrowed.append(borrowed)
            self.frozen.append(frozen)

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def width(self) -> int:
        """Hidden size C of the (B, T, C) tensors between layers."""
        return int(self.config.hidden_size)

    @property
    def context(self) -> int:
        """The longest sequence the model's positions cover."""
        return int(self.config.max_position_embeddings)

    def layer_numel(self, index: int) -> int:
        return sum(ref.numel for ref in self.owned[index])

    def hf_names(self, refs: Sequence[ParamRef]) -> list[str]:
        """Each of `refs`' name in the full transformers model's state dict (a tied parameter's first name), in
        one walk of the model's parameters (a walk per name would make an export or a checkpoint load quadratic
        in the number of parameters)."""
        names = {id(param): name for name, param in self.model.named_parameters()}
        found = []
        for ref in refs:
            name = names.get(id(self.layers[ref.layer].get_parameter(ref.name)))
            if name is None:
                raise AssertionError(f"{ref} is not a parameter of the model")
            found.append(name)
        return found

    def frozen_numel(self, index: int) -> int:
        return sum(ref.numel for ref in self.frozen[index])

    def bind(self, index: int, name: str, tensor: torch.Tensor, *, trainable: bool = True) -> nn.Parameter:
        """Register ``tensor`` (no copy; an existing Parameter as is) as ``name`` of layer ``index``."""
        module_path, _, leaf = name.rpartition(".")
        param = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, requires_grad=trainable)
        self.layers[index].get_submodule(module_path)._parameters[leaf] = param
        return param

    def release(self, first: int, stop: int) -> None:
        """Put meta tensors back into layers ``[first, stop)`` so that no real weights stay referenced."""
        for index in range(first, stop):
            for ref in self.owned[index]:
                self.bind(index, ref.name, torch.empty(ref.shape, device="meta"))
            for borrow in self.borrowed[index]:
                self.bind(index, borrow.name, torch.empty(borrow.owner.shape, device="meta"))
            for frozen in self.frozen[index]:
                self.bind(index, frozen.name, torch.empty(frozen.shape, device="meta"), trainable=False)


def gpt2_config(spec: ModelSpec) -> GPT2Config:
    """The GPT-2 config of ``spec`` (a pretrained directory's own config when one is given)."""
    if spec.pretrained_dir is not None:
        config = GPT2Config.from_pretrained(Path(spec.pretrained_dir), local_files_only=True)
    else:
        config = GPT2Config(
            n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, vocab_size=spec.vocab_size,
            n_positions=spec.n_positions, resid_pdrop=spec.dropout, embd_pdrop=spec.dropout,
            attn_pdrop=spec.dropout, bos_token_id=spec.vocab_size - 1, eos_token_id=spec.vocab_size - 1,
            n_inner=spec.n_inner, tie_word_embeddings=spec.tie_word_embeddings,
        )
    config.use_cache = False
    return config


def model_config(spec: ModelSpec) -> PretrainedConfig:
    """The transformers config of ``spec``: its pretrained directory's (read from local files only, after
    checking its family is one the engine trains) or one built from the spec's family and sizes.

    Raises ``UnknownArchitecture`` naming an unsupported architecture, ``SpecError`` for a broken config.
    """
    if spec.pretrained_dir is not None:
        family = architecture_from_config(read_config(Path(spec.pretrained_dir))).family
        config = gpt2_config(spec) if family == "gpt2" else AutoConfig.from_pretrained(
            Path(spec.pretrained_dir), local_files_only=True)
    elif spec.family == "gpt2":
        config = gpt2_config(spec)
    else:
        sizes: dict[str, object] = {
            "num_hidden_layers": spec.n_layer, "hidden_size": spec.n_embd, "num_attention_heads": spec.n_head,
            "num_key_value_heads": spec.n_kv_head or spec.n_head, "vocab_size": spec.vocab_size,
            "intermediate_size": spec.n_inner or default_intermediate(spec.family, spec.n_embd),
            "max_position_embeddings": spec.n_positions, "attention_dropout": spec.dropout,
            "tie_word_embeddings": spec.tie_word_embeddings,
            "bos_token_id": spec.vocab_size - 1, "eos_token_id": spec.vocab_size - 1,
        }
        if spec.family != "qwen2":  # Qwen2 derives it; Qwen3's own default (128) ignores the width
            sizes["head_dim"] = spec.n_embd // spec.n_head
        config = AutoConfig.for_model(spec.family, **sizes)
    config.use_cache = False
    config.architectures = [CAUSAL_LM_CLASSES[config.model_type]]
    if spec.pretrained_dir is not None:  # the engine trains and exports fp32, whatever the checkpoint stored
        config.dtype = torch.float32
    return config


def build_layer_stack(spec: ModelSpec, lora: LoraSpec | None = None) -> LayerStack:
    """Build the model on the meta device (no memory), with ``lora``'s adapters when given, and cut it
    into layers."""
    config = model_config(spec)
    model_class = getattr(transformers, CAUSAL_LM_CLASSES[config.model_type])
    with torch.device("meta"):
        model = model_class(config)
    if lora is not None:
        lora_adapters.inject(model, lora)
    return LayerStack(model, adapters=lora is not None)
