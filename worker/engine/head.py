"""The last layer of every family: the model's final norm, its LM head and the causal-LM loss.

GPT-2 (``ln_f``, a LayerNorm) and the rotary families (``norm``, an RMSNorm) differ only in the norm and the
name the model gives it, so one layer takes both; the norm keeps the model's name, and with it the layer's
parameter names, which the stores and checkpoints are keyed by.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.loss.loss_utils import ForCausalLMLoss


def summed_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The shifted cross-entropy of every predicted token, summed (nats): what ``ForCausalLMLoss`` averages,
    from the same fp32 logits and labels (every token of a row but its first is predicted)."""
    targets = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
    return nn.functional.cross_entropy(logits.float().view(-1, vocab_size), targets.to(logits.device),
                                       ignore_index=-100, reduction="sum")


class CausalLMHead(nn.Module):
    """Final norm, LM head and the shifted cross-entropy: ((B, T, C), (B, T)) -> scalar loss.

    ``norm`` is registered as ``norm_name``, the model's own name for it (GPT-2's ``ln_f``, the rotary
    families' ``norm``), before ``lm_head``: the layer's parameters are ``<norm_name>.*`` then
    ``lm_head.weight``.
    """

    def __init__(self, norm: nn.Module, lm_head: nn.Linear, vocab_size: int, *, norm_name: str) -> None:
        super().__init__()
        self.norm_name = norm_name
        self.add_module(norm_name, norm)
        self.lm_head = lm_head
        self.vocab_size = vocab_size
        self.loss_sums: list[torch.Tensor] | None = None  # set by an evaluation that wants summed losses

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        norm = self.get_submodule(self.norm_name)
        logits = self.lm_head(norm(hidden))  # (B, T, V)
        loss = ForCausalLMLoss(logits, labels, vocab_size=self.vocab_size)
        if self.loss_sums is not None:  # an evaluation: also the summed loss, for bits per byte
            self.loss_sums.append(summed_loss(logits, labels, self.vocab_size))
        return loss
