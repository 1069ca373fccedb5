"""What each unit of a trial computes, as a function of the trial's store alone.

A unit reads the shard's committed buffers and the trial state, and stages its outputs (see the buffer
names in :mod:`worker.engine.session`) and state changes for the session to commit. Its numbers are those
of plain training of the whole model in one process: the same batches, the same dropout (the RNG state
each forward ran under is saved, and a recomputed forward replays it), gradients accumulated and clipped
and updates applied with autograd's and ``torch.optim``'s own arithmetic.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from worker.engine import gradients, optimizer_step
from worker.engine.activations import KeptGraph, forward_kept, saves_storage
from worker.engine.config import TrialSpec
from worker.engine.data import TokenBlocks, eval_batch, train_batch
from worker.engine.examples import IGNORE, Batch, ExampleRows
from worker.engine.frozen_weights import dequantized_on_use
from worker.engine.head import HeadCall, lm_head
from worker.engine.layers import LayerStack, ParamRef
from worker.engine.layout import Layout
from worker.engine.lora import adapters_off
from worker.engine.pairs import PairBatch, PairRows
from worker.engine.partition import MemoryPlan
from worker.engine.preference_units import PreferenceUnits, answers_head
from worker.engine.rng import rng_state, seed_micro_batch, set_rng_state
from worker.engine.schedule import Segment, Timetable, UnitSpec, step_lr
from worker.engine.shared_base import BaseCache
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers
from worker.engine.trial_state import TrialState


class ShardUnits(PreferenceUnits):
    """The unit phases (F, FB, B, E, S; R in :class:`PreferenceUnits`) of
    :class:`~worker.engine.session.TrialSession`, which sets the attributes below; each returns the unit's
    metrics for ``UnitResult``."""

    store: SpillStore
    state: TrialState
    device: torch.device
    spec: TrialSpec
    stack: LayerStack
    data: TokenBlocks | ExampleRows | PairRows
    timetable: Timetable
    plan: MemoryPlan
    layout: Layout
    _transfers: Transfers
    _rng_numel: list[int]
    _kept: dict[tuple[int, int, int], KeptGraph]  # (step, micro-batch, shard) -> graph
    base_root: Path  # a LoRA trial's shared frozen base (worker.engine.shared_base)

    def reach(self, point: str) -> None: ...  # a fault point of the current unit (TrialSession.reach)

    # -- units ---------------------------------------------------------------------------------------

    def _forward(self, unit: UnitSpec) -> dict[str, Any]:
        """F: shard forward; save the output and the RNG state it started from. Without an autograd
        graph, unless the plan keeps this shard's activations (then the graph is kept in this process)."""
        params = self._load_shard(unit.shard)
        x = self._shard_input(unit)
        self._start_rng(unit)
        # A LoRA shard's graph would hold its frozen weights as activations: it recomputes instead.
        if (self.plan.shards[unit.shard].keep_activations and not self.layout.lent[unit.shard]
                and not self.stack.adapters):
            out, kept = forward_kept(lambda x: self._run_shard(unit.shard, params, x, None, train=True)[:2],
                                     params, x, self.device)
            self._kept[(unit.step, unit.micro_batch, unit.shard)] = kept
        else:
            with torch.no_grad():
                out = self._run_shard(unit.shard, params, x, None, train=True)[0]
        # where the micro-batch's next shard starts drawing (and this shard's backward, on recompute)
        self.store.write(f"r{unit.micro_batch}.{unit.shard + 1}", *rng_state(self.device))
        self.store.write(f"a{unit.micro_batch}.{unit.shard}", out.float())
        if self.spec.dpo is not None and self.stack.adapters:  # the reference's forward, of the same shard
            self._reference_pass(unit.shard, params, self._batch(unit), f"q{unit.micro_batch}.")
        return {}

    def _forward_backward(self, unit: UnitSpec) -> dict[str, Any]:
        """FB: the last shard's forward, loss and backward in one go (nothing to recompute)."""
        params = self._load_shard(unit.shard)
        x = self._shard_input(unit)
        self._start_rng(unit)
        self._consumed(unit)  # nothing recomputes this shard: its input and RNG state are read for the last time
        batch = self._batch(unit)
        if isinstance(batch, PairBatch):
            reference = self._pair_reference(unit.shard, params, batch, f"q{unit.micro_batch}.")
            policy, owned, lent = self._run_shard(unit.shard, params, x, answers_head(batch), train=True)
            loss, rewards = self._pair_loss(policy, reference, batch)
        else:
            loss, owned, lent = self._run_shard(unit.shard, params, x, lm_head(batch.labels, batch.loss_tokens),
                                                train=True)
            rewards = []
        head = self.stack.layers[-1]
        if len(lent) == 1 and lent[0] is head.lm_head.weight and head.token_chunk is not None and head.chunkable:
            # The tied LM head weight's gradient goes to the store in chunks of rows as the chunked loss makes
            # them: its owner's shard adds it from there (gradients.with_tied), and it never exists whole here.
            with self.store.writer(f"t{unit.micro_batch}.{unit.shard}", nbytes=lent[0].numel() * FP32) as append:
                head.weight_grad_sink.target = append
                try:
                    loss.backward()
                finally:
                    head.weight_grad_sink.target = None
            lent = []
        else:
            loss.backward()
        segment = self.timetable.segment(unit.index)
        state = self.state.step_state
        sums = [loss.item(), *rewards]
        if not segment.gathered:
            state.add(sums)
            return self._finish_backward(unit, x, owned, lent)
        # A step of one shard, whose micro-batches end in any order: the gradient and sums of one that ends ahead of
        # its turn wait (its gradient staged whole as h{m}.0) for a later one to add them, in micro-batch order.
        parked = self._take_turn(segment, unit, state.parked, sums)
        if parked is None:
            fresh = gradients.with_tied(self.store, self.layout, unit.shard, owned, self.device,
                                        micro_batch=unit.micro_batch)
            gradients.accumulate(self.store, self._transfers, f"h{unit.micro_batch}.{unit.shard}",
                                 self.layout.slots[unit.shard], fresh, owned, partial=False)
            return {}
        for _, row in [*parked, (unit.micro_batch, sums)]:
            state.add(row)
        names = [f"h{before}.{unit.shard}" for before, _ in parked]
        metrics = self._finish_backward(unit, x, owned, [], parked=names)
        for name in names:
            self.store.drop(name)
        return metrics

    def _backward(self, unit: UnitSpec) -> dict[str, Any]:
        """B: backpropagate through the kept graph, or else recompute the shard's forward from its saved
        input and RNG state (bit-identical to the original forward) and backpropagate through that."""
        params = self._load_shard(unit.shard)
        kept = self._kept.pop((unit.step, unit.micro_batch, unit.shard), None)
        if kept is not None:
            ids = self._batch(unit).ids
            kept.restore(params, self.layout.slots[unit.shard], (*ids.shape, self._width), self.device)
            out, x, owned, lent = kept.out, kept.x, kept.owned, []
            weights_saved = kept.weights_saved
        else:
            x = self._shard_input(unit)
            self._start_rng(unit)
            with saves_storage(params) as saved:
                out, owned, lent = self._run_shard(unit.shard, params, x, None, train=True)
            weights_saved = saved.seen
        if not weights_saved:
            # Backward reads no weight of this shard (an embedding's gradient depends on the token ids alone):
            # free the weights' memory for the gradients; the Parameters keep their shapes for autograd.
            params.untyped_storage().resize_(0)
        grad_out = self._read_boundary(f"d{unit.micro_batch}.{unit.shard}", out.shape)
        self._consumed(unit)
        self.store.drop(f"d{unit.micro_batch}.{unit.shard}")
        if out.requires_grad:  # else a LoRA trial's first shard, with no adapter: nothing to differentiate
            torch.autograd.backward(out, grad_out.to(out.dtype))
        return self._finish_backward(unit, x, owned, lent)

    def _evaluate(self, unit: UnitSpec) -> dict[str, Any]:
        """E: evaluation forward of one shard on one validation batch (dropout off, no graph).

        A regular evaluation reads ``eval_batches`` batches; the final one (see
        :meth:`Timetable.final_evaluation`) covers the declared held-out tokens. Both report the mean loss per
        predicted token over all their batches (the summed token losses over the tokens, as a training step's
        loss) and bits per byte: the summed token losses over ln 2 and over the UTF-8 bytes of those tokens."""
        params = self._load_shard(unit.shard)
        final = self.timetable.final_evaluation(unit.step)
        size = self.spec.micro_batch_size
        batch: Batch | PairBatch
        if final and isinstance(self.data, ExampleRows):
            rows, n_bytes = self.data.final_batch(batch=unit.micro_batch, batch_size=size)
            batch = rows.micro_batch(1, 0, self.device)
        elif final:
            ids, n_bytes = self.data.final_batch(batch=unit.micro_batch, batch_size=size)
            batch = Batch.of_blocks(ids.to(self.device))
        else:
            batch = eval_batch(self.data, batch=unit.micro_batch, batch_size=size).micro_batch(1, 0, self.device)
            n_bytes = self.data.eval_bytes(batch=unit.micro_batch, batch_size=size)
        ids = batch.ids
        self.stack.positions.ids = batch.position_ids
        x = ids
        if unit.shard:
            x = self._read_boundary(f"e{unit.micro_batch}.{unit.shard - 1}", (*ids.shape, self._width))
            self.store.drop(f"e{unit.micro_batch}.{unit.shard - 1}")
        last = unit.shard == len(self.plan.shards) - 1
        head = None if not last else answers_head(batch) if isinstance(batch, PairBatch) else lm_head(batch.labels, 1)
        with torch.no_grad():  # the last shard's output: the batch's summed token loss, or its answers' log-probs
            out = self._run_shard(unit.shard, params, x, head, train=False)[0]
        reference = None
        if isinstance(batch, PairBatch) and (last or self.stack.adapters):
            reference = self._pair_reference(unit.shard, params, batch, f"qe{unit.micro_batch}.")
        if not last:
            self.store.write(f"e{unit.micro_batch}.{unit.shard}", out.float())
            return {}
        state = self.state.eval_state
        if isinstance(batch, PairBatch):
            sums = self._pair_evaluation_sums(out, reference, batch, n_bytes)
        else:
            sums = [out.item(), int((batch.labels[:, 1:] != IGNORE).sum()), n_bytes or 0]
        parked: list[tuple[int, Any]] | None = []
        segment = self.timetable.segment(unit.index)
        if segment.gathered:  # a model of one shard, whose batches end in any order
            parked = self._take_turn(segment, unit, state.parked, sums)
            if parked is None:  # a later batch adds them
                return {}
        for _, row in [*parked, (unit.micro_batch, sums)]:
            state.add(row)
        if unit.micro_batch < (self.spec.final_eval_batches if final else self.spec.eval_batches) - 1:
            return {}
        metrics: dict[str, Any]
        if isinstance(batch, PairBatch):
            metrics = self._pair_evaluation()
        else:
            eval_loss = state.token_loss_sum / state.tokens
            bpb = state.token_loss_sum / math.log(2) / state.bytes if self.data.token_bytes is not None else None
            metrics = {"eval_loss": eval_loss, "eval_ppl": math.exp(eval_loss), "eval_bpb": bpb,
                       "eval_tokens": state.tokens, "eval_bytes": state.bytes}
        if final:  # after an early stop, the weights are those of the step that stopped it
            pending = self.state.pending
            metrics["final_step"] = pending.step + 1 if pending is not None else unit.step + 1
        else:
            metrics["stopped_early"] = self._no_longer_improving(unit.step, metrics["eval_loss"])
        self.state.reset_eval()
        return metrics

    def _take_turn(self, segment: Segment, unit: UnitSpec, parked: dict[int, Any],
                   mine: Any) -> list[tuple[int, Any]] | None:
        """For a unit of gathered ``segment`` (see :class:`~worker.engine.schedule.Segment`): when every lane before
        ``unit``'s has committed (as this unit's writer read the store), the sums hold exactly those lanes but the
        ones in ``parked``: take those out, in lane order, for the unit to add before its own. Otherwise park
        ``mine`` under its lane, for a later lane to add, and return None."""
        lane = unit.micro_batch
        if not all(self.state.committed(segment.index(before, 0)) for before in range(lane)):
            parked[lane] = mine
            return None
        return [(before, parked.pop(before)) for before in sorted(before for before in parked if before < lane)]

    def _no_longer_improving(self, step: int, eval_loss: float) -> bool:
        """Count evaluations without a new best loss; True when the trial should stop early after ``step``."""
        patience = self.spec.early_stop_patience
        if patience is None:
            return False
        record = self.state.early_stop
        if record.best is None or eval_loss < record.best:
            record.best, record.since = eval_loss, 0
        else:
            record.since += 1
        return record.since >= patience and step < self.spec.total_steps - 1

    def _final_step(self, unit: UnitSpec) -> dict[str, Any]:
        """S: apply the step's pending update: the last step's, shard by shard, when the trial ends without an
        evaluation; or, for a model of one shard, each step's, after adding the gradients its last micro-batches
        parked (those that started before every one ahead of them committed) and taking the norm."""
        metrics: dict[str, Any] = {}
        state = self.state.step_state
        if state.parked:
            lanes = sorted(state.parked)
            assert lanes[-1] == self.spec.micro_batches - 1 and self.state.shards[unit.shard].grad == "partial"
            for lane in lanes:
                state.add(state.parked.pop(lane))
            # The last parked gradient in memory, as its backward would have left it: the sum so far and the
            # parked ones before it are added into it chunk by chunk, as the micro-batches would have added them.
            # The sum stays in memory for the update, which this unit applies: no unit reads it from the store.
            names = [f"h{lane}.{unit.shard}" for lane in lanes]
            slots = self.layout.slots[unit.shard]
            summed = optimizer_step.read_chunk(self.store, self._transfers, names[-1], 0, self.layout.numel[unit.shard])
            norms = gradients.accumulate(self.store, self._transfers, f"g{unit.shard}", slots,
                                         [slot.view(summed) for slot in slots], None, partial=True, norms=True,
                                         parked=names[:-1], stage=False)
            assert norms is not None
            for name in names:
                self.store.drop(name)
            metrics = self._end_step(unit.step, unit.shard, norms)
            self._load_shard(unit.shard, grad=summed)
        else:
            self._load_shard(unit.shard)
        return metrics

    # -- pieces --------------------------------------------------------------------------------------

    @property
    def _width(self) -> int:
        return self.stack.width

    def _batch(self, unit: UnitSpec) -> Batch | PairBatch:
        """The unit's micro-batch, (B_mb, T) on the device; its position ids become the layers'."""
        batch = train_batch(self.data, seed=self.spec.seed, step=unit.step, batch_size=self.spec.batch_size)
        micro_batch = batch.micro_batch(self.spec.micro_batches, unit.micro_batch, self.device)
        self.stack.positions.ids = micro_batch.position_ids
        return micro_batch

    def _shard_input(self, unit: UnitSpec) -> torch.Tensor:
        """Token ids for shard 0, else the saved output of the previous shard (a grad-requiring leaf)."""
        ids = self._batch(unit).ids
        if unit.shard == 0:
            return ids
        x = self._read_boundary(f"a{unit.micro_batch}.{unit.shard - 1}", (*ids.shape, self._width))
        return x.requires_grad_(unit.phase != "F")

    def _read_boundary(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        return self.store.read_new(name, math.prod(shape), torch.float32).view(*shape).to(self.device)

    def _start_rng(self, unit: UnitSpec) -> None:
        """Set the generators to where the unit's shard starts drawing for its micro-batch: the micro-batch's
        seed for the first shard, else the state the previous shard's forward left (see worker.engine.rng)."""
        if unit.shard == 0:
            seed_micro_batch(self.spec.seed, unit.step, unit.micro_batch, self.device)
        else:
            raw = self.store.read_new(f"r{unit.micro_batch}.{unit.shard}", sum(self._rng_numel), torch.uint8)
            set_rng_state(raw, self._rng_numel, self.device)

    def _consumed(self, unit: UnitSpec) -> None:
        """Drop what the micro-batch's units before this one left for it alone (its input boundary and RNG
        state): none reads them again, and a trial's store then holds the boundaries of the micro-batches in
        flight only."""
        if unit.shard:
            self.store.drop(f"a{unit.micro_batch}.{unit.shard - 1}")
            self.store.drop(f"r{unit.micro_batch}.{unit.shard}")

    def _read_state(self, name: str) -> torch.Tensor:
        """Shard buffer ``name`` (its parameters) on the device, from the prefetch when it has it."""
        version = self.store.version(name)
        tensor = None if version is None else self._transfers.take((name, version))
        if tensor is None:
            tensor = self._transfers.load(self.store.path(name), self.layout.numel[int(name[1:])])
        self.store.bytes_read += tensor.nbytes
        return tensor

    def _load_shard(self, shard: int, grad: torch.Tensor | None = None) -> torch.Tensor:
        """The shard's flat parameters (P,) on the device, after applying its pending optimizer step (from the
        step's summed gradient ``grad`` when the caller holds it, else from the store)."""
        params = self._read_state(f"p{shard}")
        meta = self.state.shards[shard]
        if meta.pending:
            pending = self.state.pending
            assert pending is not None, "a shard is pending only after a step completed"
            optimizer_step.step_shard(store=self.store, transfers=self._transfers, spec=self.spec, shard=shard,
                                      params=params, step=pending.step, total_norm=pending.total_norm,
                                      optim_steps=meta.optim_steps, device=self.device, grad=grad,
                                      after_chunk=lambda: self.reach("mid-step"))
            meta.optim_steps += 1
            meta.pending, meta.grad = False, "empty"
        return params

    def _run_shard(self, shard: int, params: torch.Tensor, x: torch.Tensor, head: HeadCall | None, *,
                   train: bool, reference: bool = False
                   ) -> tuple[torch.Tensor, list[nn.Parameter], list[nn.Parameter]]:
        """Bind the shard's weights into its layers and run them; return (output, owned, lent params).

        Owned parameters are views into ``params``; a parameter borrowed from another shard is read from
        that shard's committed buffer; a LoRA trial's frozen base weights come from the host's shared base.
        The last layer is run through ``head`` (:func:`lm_head`, :func:`sequence_head`). ``reference`` runs a
        LoRA trial's layers with their adapters off (the base alone, DPO's reference). Units that need no graph
        call this under ``torch.no_grad``.
        """
        plan = self.plan.shards[shard]
        low_bit = contextlib.nullcontext()
        if self.stack.adapters:
            frozen = BaseCache.layers(self.base_root, self.stack, plan.first, plan.stop, self.device)
            if self.spec.model.base_dtype == "fp32":
                for index in range(plan.first, plan.stop):
                    for ref in self.stack.frozen[index]:
                        self.stack.bind(index, ref.name, frozen[index][ref.key], trainable=False)
            else:  # each weight full precision only while the module that reads it runs
                low_bit = dequantized_on_use(self.stack, plan.first, plan.stop, frozen,
                                             BaseCache.formats(self.base_root),
                                             torch.bfloat16 if self.spec.bf16 else torch.float32)
        else:  # this trial's plan has no room for another trial's base layers
            BaseCache.drop(self.device)
        owned = []
        bound: dict[ParamRef, nn.Parameter] = {}
        for slot in self.layout.slots[shard]:
            param = self.stack.bind(slot.ref.layer, slot.ref.name, slot.view(params))
            bound[slot.ref] = param
            owned.append(param)
        lent = []
        for index in range(plan.first, plan.stop):
            for borrow in self.stack.borrowed[index]:
                if borrow.owner in bound:
                    self.stack.bind(index, borrow.name, bound[borrow.owner])
                    continue
                owner = self.layout.by_ref[borrow.owner]
                weight = self.store.read_new(f"p{owner.shard}", borrow.owner.numel, torch.float32,
                                             offset=owner.offset * FP32).view(borrow.owner.shape)
                lent.append(self.stack.bind(index, borrow.name, weight.to(self.device)))
        layers = self.stack.layers[plan.first:plan.stop]
        with low_bit, torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.spec.bf16), \
                adapters_off(layers if reference else ()):
            for index in range(plan.first, plan.stop):
                layer = self.stack.layers[index].train(train)
                if index == len(self.stack) - 1:
                    assert head is not None, "the last layer needs its targets"
                    x = head(layer, x)
                else:
                    x = layer(x)
                if index == plan.first:
                    self.reach("mid-forward")
                    if x.requires_grad:  # a graph is built: its backward passes this point too
                        x.register_hook(lambda grad: self.reach("mid-backward"))
        return x, owned, lent

    def _finish_backward(self, unit: UnitSpec, x: torch.Tensor, owned: list[nn.Parameter],
                         lent: list[nn.Parameter], *, parked: Sequence[str] = ()) -> dict[str, Any]:
        """Accumulate the shard's gradients (plus tied contributions; after the ``parked`` gradients of the
        micro-batches before it, see :meth:`_take_turn`), pass the input gradient on, and when the step's backward is
        complete, record the global gradient norm and mark the step pending."""
        shard, store = unit.shard, self.store
        meta = self.state.shards[shard]
        if unit.shard > 0:
            store.write(f"d{unit.micro_batch}.{unit.shard - 1}", x.grad)
        if lent:
            store.write(f"t{unit.micro_batch}.{shard}", *(p.grad for p in lent))
        fresh = gradients.with_tied(store, self.layout, shard, owned, self.device, micro_batch=unit.micro_batch)
        last = unit.micro_batch == self.spec.micro_batches - 1
        norms = gradients.accumulate(store, self._transfers, f"g{shard}", self.layout.slots[shard], fresh, owned,
                                     partial=meta.grad == "partial", norms=last, parked=parked)
        meta.grad = "partial"
        if not last:
            return {}
        assert norms is not None
        return self._end_step(unit.step, shard, norms)

    def _end_step(self, step: int, shard: int, norms: list[float]) -> dict[str, Any]:
        """``shard``'s gradients of ``step`` are summed, with ``norms`` their parameters' norms: when it is the
        first shard (the last whose backward runs), the step is complete: mark it pending and report it."""
        state = self.state.step_state
        state.norms[shard] = norms
        if shard > 0:
            return {}
        total_norm = gradients.global_norm([n for s in range(len(self.plan.shards)) for n in state.norms[s]])
        metrics = {
            "loss": state.loss_sum,  # each micro-batch's loss is its part of the step's mean token (or pair) loss
            "lr": step_lr(self.spec, step),
            "grad_norm": total_norm,
            "tokens": (step + 1) * self.spec.batch_size * self.spec.data.seq_len,
        }
        if self.spec.dpo is not None:
            metrics |= {"rewards_chosen": state.chosen_reward, "rewards_rejected": state.rejected_reward,
                        "reward_accuracy": state.reward_accuracy}
        self.state.mark_step_pending(step, total_norm)
        return metrics

