"""The preference-pair parts of a DPO trial's units: the reference's forward, the reference pass, the loss and its
metrics.

**The reference** is the model DPO measures the policy's log-ratios against. A LoRA trial's is its base with the
adapters off: every unit that runs a shard forward on a pair batch also runs it as the reference (dropout off, no
graph, ``peft``'s adapters switched off module by module), from the token ids or the reference's boundary of the
shard before (``q{m}.{s}`` in training, ``qe{b}.{s}`` in evaluations, ``qr{b}.{s}`` in the reference pass: per
micro-batch, so that the micro-batches of a step may run at once, each read once and then dropped), so the reference
costs one forward without a graph per shard and no memory but a boundary: the base is the one the host shares
already. A full fine-tune's is its starting weights, which change at the first update: before step 0 the trial's
timetable runs a *reference pass* (``R`` units, :meth:`PreferenceUnits._reference`) over every kept training and
validation pair, one a row pair, dropout off, and keeps each answer's log-probability in the store (``lp{c}``,
chunks of :func:`chunk_pairs` pairs, chosen and rejected interleaved, in :attr:`PairRows.reference_order`), spilled,
checkpointed and re-planned like every other buffer. The units read them back by the batch's ``keys``.

**The loss** (:mod:`worker.engine.dpo`): the last shard sums each answer's log-probability under the policy
(with the graph) and takes the reference's; each micro-batch's loss is its summed pair losses over the pairs of
the whole batch. A training step reports, beside its loss, the mean rewards of the chosen and rejected answers
and the share of pairs whose chosen reward is the higher; an evaluation reports the mean pair loss as its
``eval_loss``, the rewards, their margin and that share, and the perplexity and bits per byte of the chosen
answers' tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from worker.engine import dpo
from worker.engine.config import TrialSpec
from worker.engine.head import HeadCall, sequence_head
from worker.engine.layers import LayerStack
from worker.engine.pairs import PairBatch, PairRows
from worker.engine.partition import MemoryPlan
from worker.engine.schedule import UnitSpec
from worker.engine.spill_store import SpillStore
from worker.engine.trial_state import TrialState

REFERENCE_CHUNK = 4096  # pairs whose reference log-probabilities one store buffer holds (about)


def chunk_pairs(micro_batch_size: int) -> int:
    """Pairs per buffer of stored reference log-probabilities: :data:`REFERENCE_CHUNK` rounded up to whole
    reference batches (``micro_batch_size // 2`` pairs each), so that a batch writes one buffer."""
    per = micro_batch_size // 2
    return per * math.ceil(REFERENCE_CHUNK / per)


def answers_head(batch: PairBatch) -> HeadCall:
    """The last layer's output for `batch`: each sequence's summed log-probability of its answer, (2 * count,)."""
    return sequence_head(batch.labels, batch.sequences, 2 * batch.count)


class PreferenceUnits:
    """The DPO pieces of :class:`~worker.engine.units.ShardUnits` (which provides the attributes and methods
    declared here) and the ``R`` phase."""

    store: SpillStore
    state: TrialState
    device: torch.device
    spec: TrialSpec
    stack: LayerStack
    plan: MemoryPlan
    _width: int

    def _load_shard(self, shard: int) -> torch.Tensor: ...
    def _read_boundary(self, name: str, shape: Sequence[int]) -> torch.Tensor: ...
    def _run_shard(self, shard: int, params: torch.Tensor, x: torch.Tensor, head: HeadCall | None, *,
                   train: bool, reference: bool = False
                   ) -> tuple[torch.Tensor, list[nn.Parameter], list[nn.Parameter]]: ...

    @property
    def _pairs(self) -> PairRows:
        data = self.data  # type: ignore[attr-defined]
        assert isinstance(data, PairRows), "a DPO trial trains on pairs"
        return data

    def _reference(self, unit: UnitSpec) -> dict[str, Any]:
        """R: the reference's forward of one shard on a reference batch (a full fine-tune's starting weights,
        before step 0); the last shard stores each answer's log-probability."""
        params = self._load_shard(unit.shard)
        size = self.spec.micro_batch_size
        batch = self._pairs.reference_batch(batch=unit.micro_batch, batch_size=size).micro_batch(1, 0, self.device)
        self.stack.positions.ids = batch.position_ids
        log_probs = self._reference_pass(unit.shard, params, batch, f"qr{unit.micro_batch}.")
        if log_probs is not None:
            chunk, offset = divmod(unit.micro_batch * (size // 2), chunk_pairs(size))
            name = f"lp{chunk}"
            before = [self.store.read_new(name, 2 * offset, torch.float32)] if offset else []
            self.store.write(name, *before, log_probs.float())
        return {}

    def _reference_pass(self, shard: int, params: torch.Tensor, batch: PairBatch, prefix: str) -> torch.Tensor | None:
        """The reference's forward of `shard` on `batch` (dropout off, no graph; a LoRA trial's adapters off),
        from the token ids or the boundary ``{prefix}{shard - 1}``: the last shard returns each answer's
        log-probability (2 * count,), another writes its output as ``{prefix}{shard}``."""
        ids = batch.ids
        last = shard == len(self.plan.shards) - 1
        x = ids
        if shard:
            x = self._read_boundary(f"{prefix}{shard - 1}", (*ids.shape, self._width))
            self.store.drop(f"{prefix}{shard - 1}")  # its one reader
        with torch.no_grad():
            out = self._run_shard(shard, params, x, answers_head(batch) if last else None, train=False,
                                  reference=True)[0]
        if last:
            return out
        self.store.write(f"{prefix}{shard}", out.float())
        return None

    def _pair_reference(self, shard: int, params: torch.Tensor, batch: PairBatch, prefix: str) -> torch.Tensor | None:
        """The reference's part of a unit of `shard` on `batch`: a LoRA trial's forward with the adapters off
        (:meth:`_reference_pass`), a full fine-tune's stored log-probabilities at the last shard."""
        if self.stack.adapters:
            return self._reference_pass(shard, params, batch, prefix)
        return self._stored_reference(batch.keys)

    def _stored_reference(self, keys: torch.Tensor) -> torch.Tensor:
        """(2 * len(keys),): the stored reference log-probabilities of the pairs of `keys`, chosen then rejected."""
        per_chunk = chunk_pairs(self.spec.micro_batch_size)
        total = len(self._pairs.reference_order)
        out = torch.empty(len(keys), 2)
        chunks = keys // per_chunk
        for chunk in torch.unique(chunks).tolist():
            held = min(per_chunk, total - chunk * per_chunk)
            values = self.store.read_new(f"lp{chunk}", 2 * held, torch.float32).view(held, 2)
            inside = chunks == chunk
            out[inside] = values[keys[inside] - chunk * per_chunk]
        return out.reshape(-1).to(self.device)

    def _pair_loss(self, policy: torch.Tensor, reference: torch.Tensor | None,
                   batch: PairBatch) -> tuple[torch.Tensor, list[float]]:
        """The micro-batch's part of the step's loss (its summed pair losses over the batch's pairs), and its parts
        of the step's mean rewards and accuracy (``StepState.REWARDS``' order), for the step's running sums."""
        assert self.spec.dpo is not None and reference is not None
        terms = dpo.pair_terms(policy, reference, spec=self.spec.dpo,
                               answer_tokens=batch.answer_tokens().to(policy.device))
        rewards = [terms.chosen_rewards.sum().item() / batch.pairs, terms.rejected_rewards.sum().item() / batch.pairs,
                   terms.accurate.sum().item() / batch.pairs]
        return terms.losses.sum() / batch.pairs, rewards

    def _pair_evaluation_sums(self, policy: torch.Tensor, reference: torch.Tensor | None, batch: PairBatch,
                              n_bytes: int | None) -> list[float]:
        """An evaluation batch's sums over its pairs, for the evaluation's running sums (``EvalState.PAIR_SUMS``'
        order): pairs, their losses, chosen and rejected rewards, how many ranked the chosen answer higher, and the
        chosen answers' summed token loss, tokens and bytes."""
        assert self.spec.dpo is not None and reference is not None
        answer_tokens = batch.answer_tokens()
        terms = dpo.pair_terms(policy, reference, spec=self.spec.dpo, answer_tokens=answer_tokens.to(policy.device))
        return [batch.count, terms.losses.sum().item(), terms.chosen_rewards.sum().item(),
                terms.rejected_rewards.sum().item(), int(terms.accurate.sum()), -policy[0::2].sum().item(),
                int(answer_tokens[0::2].sum()), n_bytes or 0]

    def _pair_evaluation(self) -> dict[str, Any]:
        """The metrics of the evaluation whose pairs' sums (:meth:`_pair_evaluation_sums`) were added up."""
        state = self.state.eval_state
        chosen_loss = state.token_loss_sum / state.tokens
        return {
            "eval_loss": state.pair_loss_sum / state.pairs,
            "eval_ppl": math.exp(chosen_loss),
            "eval_bpb": (state.token_loss_sum / math.log(2) / state.bytes
                         if self._pairs.token_bytes is not None else None),
            "eval_tokens": state.tokens, "eval_bytes": state.bytes,
            "eval_rewards_chosen": state.chosen_reward_sum / state.pairs,
            "eval_rewards_rejected": state.rejected_reward_sum / state.pairs,
            "eval_reward_margin": (state.chosen_reward_sum - state.rejected_reward_sum) / state.pairs,
            "eval_reward_accuracy": state.accurate / state.pairs,
        }
