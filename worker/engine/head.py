"""The last layer of every family: the model's final norm, its LM head and the causal-LM loss.

GPT-2 (``ln_f``, a LayerNorm) and the rotary families (``norm``, an RMSNorm) differ only in the norm and the
name the model gives it, so one layer takes both; the norm keeps the model's name, and with it the layer's
parameter names, which the stores and checkpoints are keyed by.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.loss.loss_utils import ForCausalLMLoss

from worker.engine.chunked_loss import IGNORE, GradSink, picked_log_probs, picked_loss
from worker.engine.dpo import sequence_sums


def shifted_targets(labels: torch.Tensor) -> torch.Tensor:
    """Each position's target, flattened: the next token's label (every token of a row but its first is
    predicted; a row's last position predicts nothing), as ``ForCausalLMLoss`` shifts them. The same shift of
    any (B, T) per-token tensor gives each position's value for the token it predicts."""
    return nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1)


class CausalLMHead(nn.Module):
    """Final norm, LM head and the shifted cross-entropy: ((B, T, C), (B, T), loss_tokens) -> scalar loss.

    The loss is the summed cross-entropy of the tokens the labels cover divided by ``loss_tokens``, the tokens
    the whole batch's loss covers (:class:`~worker.engine.examples.Batch`): micro-batches of one step add up to
    the step's mean token loss however the batch is cut, as transformers' loss with ``num_items_in_batch``.
    ``loss_tokens`` of 1 gives the summed loss (evaluations add sums up over their batches).

    :meth:`sequence_log_probs` is the other output a head gives: each sequence's summed log-probability of its
    labelled tokens (a preference pair's answers, for DPO), whole or in the same token chunks.

    ``norm`` is registered as ``norm_name``, the model's own name for it (GPT-2's ``ln_f``, the rotary
    families' ``norm``), before ``lm_head``: the layer's parameters are ``<norm_name>.*`` then
    ``lm_head.weight``.

    With ``token_chunk`` set (the trial's plan sets it when the budget cannot hold a micro-batch's logits), the
    loss is :mod:`worker.engine.chunked_loss`'s: the same numbers, never more than ``token_chunk`` rows of
    logits at once. A head whose ``lm_head`` is not a plain bias-free linear layer (a LoRA-adapted one) has
    no chunked form (``chunkable``) and computes its logits whole.
    """

    def __init__(self, norm: nn.Module, lm_head: nn.Linear, vocab_size: int, *, norm_name: str) -> None:
        super().__init__()
        self.norm_name = norm_name
        self.add_module(norm_name, norm)
        self.lm_head = lm_head
        self.vocab_size = vocab_size
        self.token_chunk: int | None = None  # rows of logits at once; None: the micro-batch's whole logits
        # In chunks only: where backward hands the LM head weight's gradient, a chunk of rows at a time, instead
        # of its .grad, when a unit sets its target for one backward (see chunked_loss.picked_log_probs).
        self.weight_grad_sink = GradSink()

    @property
    def chunkable(self) -> bool:
        return type(self.lm_head) is nn.Linear and self.lm_head.bias is None

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, loss_tokens: int) -> torch.Tensor:
        divisor = max(loss_tokens, 1)  # a batch that trains no token has a loss of 0, as TRL clamps it
        norm = self.get_submodule(self.norm_name)
        if self.token_chunk is not None and self.chunkable:
            normed = norm(hidden)
            targets = shifted_targets(labels).to(normed.device)
            picked = picked_log_probs(normed.reshape(-1, normed.shape[-1]), self.lm_head.weight, targets,
                                      self.token_chunk, weight_grad_sink=self.weight_grad_sink)
            return picked_loss(picked, targets, reduction="sum") / divisor
        logits = self.lm_head(norm(hidden))  # (B, T, V)
        return ForCausalLMLoss(logits, labels, vocab_size=self.vocab_size, num_items_in_batch=divisor)

    def sequence_log_probs(self, hidden: torch.Tensor, labels: torch.Tensor, sequences: torch.Tensor,
                           count: int) -> torch.Tensor:
        """(count,): per sequence, the summed log-probability of its labelled tokens, from hidden (B, T, C),
        labels (B, T) and the sequence of each token (B, T; 0..count-1, -1 for padding). The log-probabilities
        are ``log_softmax`` of the float logits (whole, or a token chunk at a time: the same numbers), picked at
        the targets and summed per sequence in token order (:func:`worker.engine.dpo.sequence_sums`)."""
        norm = self.get_submodule(self.norm_name)
        targets = shifted_targets(labels).to(hidden.device)  # (N,)
        owners = torch.where(targets == IGNORE, -1, shifted_targets(sequences).to(hidden.device))
        if self.token_chunk is not None and self.chunkable:
            normed = norm(hidden)
            picked = picked_log_probs(normed.reshape(-1, normed.shape[-1]), self.lm_head.weight, targets,
                                      self.token_chunk, weight_grad_sink=self.weight_grad_sink).squeeze(1)
        else:
            logits = self.lm_head(norm(hidden))  # (B, T, V)
            log_probs = torch.log_softmax(logits.float().reshape(-1, logits.shape[-1]), dim=-1)  # (N, V)
            picked = log_probs.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
        return sequence_sums(picked, owners, count)


# What the last layer of a unit's shard computes from its input (a unit's choice): the loss of a training step,
# the summed token loss of an evaluation batch, or each sequence's log-probability (DPO).
HeadCall = Callable[[CausalLMHead, torch.Tensor], torch.Tensor]


def lm_head(labels: torch.Tensor, loss_tokens: int) -> HeadCall:
    """The causal-LM loss of `labels`: their summed token loss divided by `loss_tokens` (1: the sum)."""
    return lambda layer, hidden: layer(hidden, labels, loss_tokens)


def sequence_head(labels: torch.Tensor, sequences: torch.Tensor, count: int) -> HeadCall:
    """Each of `count` sequences' summed log-probability of its labelled tokens
    (:meth:`CausalLMHead.sequence_log_probs`)."""
    return lambda layer, hidden: layer.sequence_log_probs(hidden, labels, sequences, count)
