"""DPO's and IPO's losses on preference pairs, as TRL's ``DPOTrainer`` computes them (trl 1.16, ``loss_type``
``sigmoid`` and ``ipo``, its default f-divergence).

An answer's log-probability is the sum of its answer tokens' log-probabilities (:func:`sequence_sums`), under the
trained model (the policy) and under the reference; ``ratio = log pi - log pi_ref`` and the answer's implicit
reward is ``beta * ratio``. Per pair:

- ``sigmoid`` (DPO, Rafailov et al. 2023): ``-log sigmoid(beta * (ratio_chosen - ratio_rejected))``;
- ``ipo`` (IPO, Azar et al. 2023): ``(ratio_chosen / n_chosen - ratio_rejected / n_rejected - 1 / (2 beta))^2``,
  each ratio per answer token, as TRL normalizes it.

A step's loss is the mean of the pair losses over every pair of the whole batch: each micro-batch divides its
summed pair losses by the batch's pair count (:attr:`worker.engine.pairs.PairBatch.pairs`), so how the batch is
cut into micro-batches changes neither the objective nor the gradients (docs/engine.md, *The loss of a step*).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from worker.engine.config import DpoSpec


def sequence_sums(picked: torch.Tensor, owners: torch.Tensor, count: int) -> torch.Tensor:
    """(count,): the sum of ``picked`` (N,) per owner, the values of owner -1 left out; each sum adds its values in
    their order from 0, one ``index_add`` (the plain loop of the tests sums the same way)."""
    keep = owners >= 0
    return picked.new_zeros(count).index_add(0, owners[keep], picked[keep])


@dataclass(frozen=True)
class PairTerms:
    """Per pair of a (micro-)batch: its loss (with the policy's graph), and its answers' implicit rewards."""

    losses: torch.Tensor  # (P,)
    chosen_rewards: torch.Tensor  # (P,) beta * (log pi - log pi_ref) of the chosen answers, no graph
    rejected_rewards: torch.Tensor  # (P,) of the rejected ones

    @property
    def accurate(self) -> torch.Tensor:
        """(P,) bool: the chosen answer's reward is above the rejected one's (TRL's rewards/accuracies)."""
        return self.chosen_rewards > self.rejected_rewards


def pair_terms(policy: torch.Tensor, reference: torch.Tensor, *, spec: DpoSpec,
               answer_tokens: torch.Tensor) -> PairTerms:
    """The terms of P pairs from their answers' log-probabilities (2P,), chosen at even and rejected at odd
    places, under the policy and the reference, and their answer tokens (2P,)."""
    chosen_ratio = policy[0::2] - reference[0::2]  # (P,)
    rejected_ratio = policy[1::2] - reference[1::2]
    if spec.loss_type == "sigmoid":
        losses = -F.logsigmoid(spec.beta * (chosen_ratio - rejected_ratio))
    else:
        delta = chosen_ratio / answer_tokens[0::2] - rejected_ratio / answer_tokens[1::2]
        losses = (delta - 1 / (2 * spec.beta)) ** 2
    return PairTerms(losses=losses, chosen_rewards=spec.beta * chosen_ratio.detach(),
                     rejected_rewards=spec.beta * rejected_ratio.detach())
