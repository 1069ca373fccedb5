"""Layers of the rotary-embedding decoder families (Llama, Mistral, Qwen2, Qwen3), one adapter for all.

These families share one structure: token embedding, decoder layers fed the rotary position embedding
(cos, sin) that the model computes once per forward, a final RMSNorm, and an LM head (tied to the embedding
or not) with the causal-LM loss. Each layer calls the model's own submodules with the arguments its
``*Model.forward`` passes them, so a layer-by-layer run is bit-identical to the whole model; what differs
between the families (Qwen2's q/k/v biases, Qwen3's q/k norms, grouped-query attention) lives inside the
model's own decoder layer and needs nothing here. The attention mask is built per layer with the
function the model itself picks for that layer: a causal mask, or Mistral's and Qwen's sliding-window mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from worker.engine.head import CausalLMHead
from worker.engine.positions import Positions

MaskFunction = Callable[..., Any]


def mask_function(config: PretrainedConfig, layer_index: int) -> MaskFunction:
    """The mask the family's model gives decoder layer ``layer_index``: Qwen2/Qwen3 by the config's
    ``layer_types``, Mistral a sliding window for every layer when ``sliding_window`` is set, Llama causal."""
    layer_types = getattr(config, "layer_types", None)
    if config.model_type in ("qwen2", "qwen3") and layer_types is not None:
        sliding = layer_types[layer_index] == "sliding_attention"
    else:
        sliding = config.model_type == "mistral" and config.sliding_window is not None
    return create_sliding_window_causal_mask if sliding else create_causal_mask


class RotaryCache:
    """The model's rotary embedding, evaluated once per (sequence length, device, dtype) and shared by every
    decoder layer, as the model's forward computes it once for all of them.

    Holds its own copy of the rotary module (built on the CPU: the model's is on the meta device, and its
    ``inv_freq`` buffer is computed from the config, not stored). Not an ``nn.Module``, so the layers that
    use it own no extra parameters or buffers.
    """

    def __init__(self, config: PretrainedConfig, rotary_class: type[nn.Module]) -> None:
        with torch.device("cpu"):
            self.rotary = rotary_class(config=config)
        self._key: tuple[int, torch.device, torch.dtype] | None = None
        self._ids: torch.Tensor | None = None  # the packed rows' position ids the value is for, else None
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, hidden: torch.Tensor, position_ids: torch.Tensor,
                 packed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for `position_ids`; `packed` is the same ids when they are a batch's own (packed
        rows), which the value is then kept for, else None (positions 0..T-1)."""
        key = (hidden.shape[1], hidden.device, hidden.dtype)
        if self._key != key or self._ids is not packed or self._value is None:
            with torch.no_grad():
                self._value = self.rotary(hidden, position_ids)
            self._key, self._ids = key, packed
        return self._value


class TokenEmbedding(nn.Module):
    """input_ids (B, T) -> hidden (B, T, C): the model's ``embed_tokens`` (these families add no positions)."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class DecoderLayer(nn.Module):
    """One decoder layer with the mask and rotary embedding the model's forward gives it: (B, T, C) -> (B, T, C)."""

    def __init__(self, layer: nn.Module, config: PretrainedConfig, mask: MaskFunction, rotary: RotaryCache,
                 positions: Positions) -> None:
        super().__init__()
        self.layer = layer
        self.config = config
        self.mask = mask
        self.rotary = rotary
        self.positions = positions

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        position_ids = self.positions.of(hidden)  # (1, T), or (B, T) for packed rows
        mask = self.mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                         position_ids=position_ids)
        position_embeddings = self.rotary(hidden, position_ids, self.positions.ids)
        return self.layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                          position_ids=position_ids, cache=None, use_cache=False)


def rotary_layers(model: nn.Module, positions: Positions) -> tuple[list[nn.Module], list[str]]:
    """The layers and names of a ``*ForCausalLM`` of a rotary family: embedding, ``block.<i>``, head; the
    decoder layers read their position ids from `positions`."""
    config, body = model.config, model.model
    rotary = RotaryCache(config, type(body.rotary_emb))
    blocks = body.layers[: config.num_hidden_layers]
    layers: list[nn.Module] = [
        TokenEmbedding(body.embed_tokens),
        *(DecoderLayer(block, config, mask_function(config, i), rotary, positions) for i, block in enumerate(blocks)),
        CausalLMHead(body.norm, model.lm_head, config.vocab_size, norm_name="norm"),
    ]
    return layers, ["embedding", *(f"block.{i}" for i in range(len(blocks))), "head"]
