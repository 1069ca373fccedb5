"""Trials as resumable sequences of shard units whose whole state lives in the spill store.

``trial_create`` profiles, plans and initializes a trial straight into its spill directory;
``TrialSession.open`` picks it up in any process, and each ``run_unit`` runs the next unit of the
timetable (:mod:`worker.engine.schedule`) and commits its outputs together with the advanced cursor.
A unit killed half-way leaves the previous commit, and re-running it gives identical numbers because
the RNG state is part of the store.

Spill buffer names (per trial directory)::

    p{s} g{s}        shard s: flat fp32 parameters and accumulated gradients
    m{s} v{s}        shard s: optimizer state (AdamW exp_avg and exp_avg_sq; SGD momentum in m)
    t{s}             shard s: gradients of parameters it borrows from another shard (tied weights)
    a{m}.{s} d{m}.{s} output of shard s for micro-batch m, and the loss gradient w.r.t. it
    r{m}.{s}         RNG state before shard s ran forward on micro-batch m (replayed by the recompute)
    rng              the trial's RNG stream (dropout of plain training, unit after unit)
    rs               the RNG stream as the current step started (to roll the step back, see repartition)
    e{s}             output of shard s for the current evaluation batch
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from worker.engine.config import TrialSpec
from worker.engine.data import TokenBlocks
from worker.engine.errors import EngineError, SpecError
from worker.engine.layers import Borrow, LayerStack, ParamRef, build_layer_stack
from worker.engine.partition import MemoryPlan, choose_kept, plan_with_shards, solve
from worker.engine.profile import copy_bytes_per_s, optimizer_slots, profile_layers
from worker.engine.schedule import Timetable, UnitSpec, lr_factor
from worker.engine.spill_store import SpillStore
from worker.engine.transfer import Transfers
from worker.engine.weights import PretrainedWeights, init_layer

FP32 = 4
STEP_CHUNK = 1 << 20  # elements of gradient and optimizer state on the device at once during a step


@dataclass(frozen=True, kw_only=True)
class UnitResult:
    """What one unit did. Step metrics are set on the unit that completes a step's backward; eval
    metrics on the unit that completes an evaluation. ``peak_device_bytes`` is ``None`` on CPU."""

    unit: UnitSpec
    seconds: float
    bytes_read: int
    bytes_written: int
    peak_device_bytes: int | None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None
    eval_loss: float | None = None
    eval_ppl: float | None = None
    stopped_early: bool = False


def _rng_state(device: torch.device) -> list[torch.Tensor]:
    if device.type == "cuda":
        return [torch.get_rng_state(), torch.cuda.get_rng_state(device)]
    return [torch.get_rng_state()]


@contextlib.contextmanager
def _caller_rng_kept(device: torch.device) -> Iterator[None]:
    """Units set the global RNG to their trial's stream; give the caller its own state back afterwards."""
    saved = _rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        if device.type == "cuda":
            torch.cuda.set_rng_state(saved[1], device)


def _initial_rng(seed: int, device: torch.device) -> list[torch.Tensor]:
    """The RNG state right after ``torch.manual_seed(seed)``: where plain training's dropout starts."""
    states = [torch.Generator().manual_seed(seed).get_state()]
    if device.type == "cuda":
        states.append(torch.Generator(device=device).manual_seed(seed).get_state())
    return states


@dataclass(frozen=True)
class _Slot:
    """An owned parameter at element ``offset`` of its shard's flat buffers."""

    ref: ParamRef
    shard: int
    offset: int


class _Layout:
    """Where every parameter lives: flat offsets per shard, and the cross-shard borrows (tied weights)."""

    def __init__(self, stack: LayerStack, plan: MemoryPlan) -> None:
        self.shard_of_layer = [s.index for s in plan.shards for _ in range(s.first, s.stop)]
        self.slots: list[list[_Slot]] = []
        self.by_ref: dict[ParamRef, _Slot] = {}
        for shard in plan.shards:
            offset, slots = 0, []
            for index in range(shard.first, shard.stop):
                for ref in stack.owned[index]:
                    slot = _Slot(ref, shard.index, offset)
                    slots.append(slot)
                    self.by_ref[ref] = slot
                    offset += ref.numel
            self.slots.append(slots)
        self.numel = [sum(slot.ref.numel for slot in slots) for slots in self.slots]
        # (borrow, element offset in t{borrowing shard}) for borrows whose owner sits in another shard
        self.lent: list[list[tuple[Borrow, int]]] = []
        for shard in plan.shards:
            offset, lent = 0, []
            for index in range(shard.first, shard.stop):
                for borrow in stack.borrowed[index]:
                    if self.by_ref[borrow.owner].shard != shard.index:
                        lent.append((borrow, offset))
                        offset += borrow.owner.numel
            self.lent.append(lent)

    def incoming(self, shard: int) -> Iterator[tuple[_Slot, int, int]]:
        """(owned slot, borrowing shard, offset in its t buffer) for borrows of ``shard``'s parameters."""
        for borrower, lent in enumerate(self.lent):
            for borrow, offset in lent:
                slot = self.by_ref[borrow.owner]
                if slot.shard == shard:
                    yield slot, borrower, offset


@dataclass
class _Kept:
    """A forward unit's autograd graph, kept in this process for the matching backward unit.

    Saved activations stay in host memory (moved off the device on CUDA); saved weights are not kept but
    re-pointed at the shard's parameters as reloaded by the backward unit (``params``); the input leaf,
    the output and the Parameters keep only their identity. Between the two units the graph holds no
    device memory.
    """

    out: torch.Tensor
    x: torch.Tensor
    owned: list[nn.Parameter]
    params: torch.Tensor | None = None


def trial_create(*, spec: TrialSpec, spill_dir: Path, trial_id: str, device: torch.device,
                 cuts: Sequence[int] | None = None) -> MemoryPlan:
    """Profile, plan and initialize a trial into ``spill_dir/trial_id``; return its memory plan.

    Layers are initialized (or read from the pretrained directory) one at a time and streamed into the
    store, so the model never exists whole in memory. ``cuts`` forces the shard start layers instead of
    solving (tests and benchmarks use it). Raises ``BudgetError`` when a layer cannot fit the budget,
    ``SpecError`` for bad data or checkpoints, ``SpillStoreError`` if the trial directory is taken.
    """
    stack = build_layer_stack(spec.model)
    if spec.data.seq_len > stack.config.n_positions:
        raise SpecError(f"seq_len {spec.data.seq_len} exceeds the model's context of {stack.config.n_positions}")
    TokenBlocks(spec.data, vocab_size=stack.config.vocab_size)  # fail on bad data before any work
    costs = profile_layers(stack, spec, device)
    plan = solve(costs, spec.budget_bytes) if cuts is None else plan_with_shards(costs, cuts, spec.budget_bytes)
    if spec.activations == "auto":
        plan = choose_kept(plan, copy_bytes_per_s(device))
    store = SpillStore.create(Path(spill_dir) / trial_id, {
        "trial_id": trial_id,
        "spec": spec.to_dict(),
        "plan": plan.to_dict(),
        "cursor": 0,
        "shards": [{"pending": False, "grad": "empty", "optim_steps": 0} for _ in plan.shards],
        "pending": None,
        "step_state": {"loss_sum": 0.0, "norms": {}},
        "eval_state": {"loss_sum": 0.0},
    })
    source = PretrainedWeights(Path(spec.model.pretrained_dir)) if spec.model.pretrained_dir else None

    def layer_weights(shard: int) -> Iterator[torch.Tensor]:
        for index in range(plan.shards[shard].first, plan.shards[shard].stop):
            yield from source.layer(stack, index) if source else init_layer(stack, index, spec.seed)

    def zeros(shard: int) -> Iterator[torch.Tensor]:
        for index in range(plan.shards[shard].first, plan.shards[shard].stop):
            yield torch.zeros(stack.layer_numel(index))

    for shard in plan.shards:
        store.write_stream(f"p{shard.index}", layer_weights(shard.index))
        if spec.optimizer.kind == "adamw":  # both moments start at zero, as in torch.optim.AdamW
            store.write_stream(f"m{shard.index}", zeros(shard.index))
            store.write_stream(f"v{shard.index}", zeros(shard.index))
    store.write("rng", *_initial_rng(spec.seed, device))
    store.commit()
    return plan


class TrialSession:
    """One trial opened from its spill directory; runs its units one at a time, in any process.

    The session holds no training state of its own beyond caches: everything that matters is committed
    in the store after each unit, and every call first picks up commits made elsewhere, so sessions of
    the same trial in different processes are interchangeable (as long as only one runs a unit at a time).
    """

    def __init__(self, store: SpillStore, device: torch.device) -> None:
        self.store = store
        self.device = device
        manifest = store.manifest
        self.trial_id: str = manifest["trial_id"]
        self.spec = TrialSpec.from_dict(manifest["spec"])
        self.stack = build_layer_stack(self.spec.model)
        self.data = TokenBlocks(self.spec.data, vocab_size=self.stack.config.vocab_size)
        self._rng_numel = [state.numel() for state in _rng_state(device)]
        self._kept: dict[tuple[int, int, int], _Kept] = {}  # (step, micro-batch, shard) -> graph
        # Fault injection for tests of out-of-memory recovery on machines without a GPU: a unit whose
        # shard's planned peak (MemoryPlan.unit_peak_bytes) exceeds this raises torch.OutOfMemoryError
        # just before its commit, as a GPU with that much memory would have. None (always, in production)
        # turns it off.
        self.fault_oom_above_bytes: int | None = None
        # Staging buffers hold one optimizer-state chunk; whole shards stream through them chunk by chunk.
        self._transfers = Transfers(device, max_numel=STEP_CHUNK)
        self._adopt_plan()

    def _adopt_plan(self) -> None:
        """Derive everything that depends on the store's plan; again after the trial was re-planned."""
        manifest = self.store.manifest
        self.replans: int = manifest.get("replans", 0)
        self.plan = MemoryPlan.from_dict(manifest["plan"])
        self.layout = _Layout(self.stack, self.plan)
        self.timetable = Timetable(
            shards=len(self.plan.shards), steps=self.spec.steps, micro_batches=self.spec.micro_batches,
            eval_every=self.spec.eval_every, eval_batches=self.spec.eval_batches,
        )
        self._transfers.retain({})  # reads of the old plan's buffers will never be taken
        self._kept.clear()

    def reopen(self, store: SpillStore) -> None:
        """Continue from ``store``, a newer view of this trial's directory (another process may have run
        units or re-planned the trial since this session last looked)."""
        self.store = store
        if store.manifest.get("replans", 0) != self.replans:
            self._adopt_plan()

    def close(self) -> None:
        """Stop the background reader (the scheduler calls it when it drops a cached session)."""
        self._transfers.close()

    @classmethod
    def open(cls, *, spill_dir: Path, trial_id: str, device: torch.device) -> TrialSession:
        """Open the last committed state of trial ``trial_id``; raises ``SpillStoreError`` if absent."""
        return cls(SpillStore.open(Path(spill_dir) / trial_id), device)

    # -- the scheduler's view ------------------------------------------------------------------------

    def next_unit(self) -> UnitSpec | None:
        """The unit :meth:`run_unit` would run, or ``None`` when the trial is finished."""
        self._sync()
        cursor = self.store.manifest["cursor"]
        return self.timetable[cursor] if cursor < len(self.timetable) else None

    def remaining_units(self) -> int:
        self._sync()
        return len(self.timetable) - self.store.manifest["cursor"]

    def _sync(self) -> None:
        """Pick up commits made by other processes since this session last looked (SHARP moves trials)."""
        if self.store.is_current():  # a stat, where reading the manifest costs a parse: units call this often
            return
        on_disk = SpillStore.open(self.store.root)
        if on_disk.manifest["version"] != self.store.manifest["version"]:
            self.reopen(on_disk)

    def keeps_activations(self) -> bool:
        """Whether this session holds forward activations that a coming backward unit will use (another
        process would recompute them)."""
        return bool(self._kept)

    def prefetching(self) -> list[str]:
        """The buffers being read in the background for a coming unit (see :meth:`prefetch`)."""
        return [name for name, _ in self._transfers.pending()]

    def prefetch(self, unit: UnitSpec) -> None:
        """Start reading ``unit``'s shard state (parameters, and accumulated gradients when the unit adds
        to them) in the background, so that :meth:`run_unit` finds it loaded.

        Call it for the unit after the one about to run. What it reads is keyed by buffer version, so
        prefetching early is always safe; at worst the read is wasted.
        """
        self._sync()
        shard, meta = unit.shard, self.store.manifest["shards"][unit.shard]
        names = [f"p{shard}"]
        if unit.phase in ("B", "FB") and meta["grad"] == "partial" and not meta["pending"]:
            names.append(f"g{shard}")
        for name in names:
            version = self.store.version(name)
            assert version is not None, f"{name} is always in the store when a unit may read it"
            self._transfers.start((name, version), self.store.path(name), self.layout.numel[shard])

    def _read_state(self, name: str) -> torch.Tensor:
        """Shard buffer ``name`` (p or g) on the device, from the prefetch when it has it."""
        version = self.store.version(name)
        tensor = None if version is None else self._transfers.take((name, version))
        if tensor is None:
            tensor = self._transfers.load(self.store.path(name), self.layout.numel[int(name[1:])])
        self.store.bytes_read += tensor.nbytes
        return tensor

    def run_unit(self, *, token: int | None = None) -> UnitResult:
        """Run the next unit and commit its outputs with the advanced cursor (all or nothing).

        ``token`` is the caller's fencing token (the scheduler passes its lease's token; larger is newer):
        the unit first takes the store with it, and its commit is refused if a writer with a newer token
        took the trial meanwhile. ``None`` is for a trial that only this process runs (no fencing, but
        the commit still refuses if another commit landed since). Raises ``StaleWriterError`` when refused:
        nothing was written and the unit's result must be dropped. On any exception the session reloads
        the last commit, so it stays usable; the unit re-runs.
        """
        if token is not None:
            self.reopen(SpillStore.take(self.store.root, token))  # also removes orphans, under the lock
        unit = self.next_unit()
        if unit is None:
            raise EngineError(f"trial {self.trial_id} is finished: no unit left to run")
        if token is None:
            self.store.remove_orphans()  # we are the trial's one writer now
        read0, written0 = self.store.bytes_read, self.store.bytes_written
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        run = {"F": self._forward, "FB": self._forward_backward, "B": self._backward,
               "E": self._evaluate, "S": self._final_step}[unit.phase]
        for key in [k for k in self._kept if k[0] < unit.step or unit.phase in ("E", "S")]:
            del self._kept[key]  # the backward that would use it ran elsewhere
        try:
            with _caller_rng_kept(self.device):
                metrics = run(unit)
            limit = self.fault_oom_above_bytes
            if limit is not None and self.plan.unit_peak_bytes(unit.shard) > limit:
                raise torch.OutOfMemoryError(
                    f"fault injection: shard {unit.shard} plans a peak of {self.plan.unit_peak_bytes(unit.shard)} "
                    f"bytes, over the injected device memory of {limit} bytes")
            # An early stop ends the timetable here: the evaluation has applied every pending update.
            self.store.manifest["cursor"] = len(self.timetable) if metrics.get("stopped_early") else unit.index + 1
            self.store.commit()
            self._transfers.retain(self.store.manifest["files"])
        except BaseException:
            self.reopen(SpillStore.open(self.store.root))
            self._kept.clear()
            raise
        finally:
            self.stack.release(self.plan.shards[unit.shard].first, self.plan.shards[unit.shard].stop)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return UnitResult(
            unit=unit, seconds=time.perf_counter() - start,
            bytes_read=self.store.bytes_read - read0, bytes_written=self.store.bytes_written - written0,
            peak_device_bytes=torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None,
            **metrics,
        )

    def export(self, out_dir: Path) -> None:
        """Write the committed weights as a transformers ``save_pretrained`` directory (safetensors).

        One safetensors file per shard plus an index, so only one shard is in memory at a time. Weights
        of a step whose update is still pending (mid-trial) are exported as they were before that step.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.stack.config.save_pretrained(out_dir)
        n = len(self.plan.shards)
        weight_map: dict[str, str] = {}
        total = 0
        for shard in range(n):
            filename = "model.safetensors" if n == 1 else f"model-{shard + 1:05d}-of-{n:05d}.safetensors"
            flat = self.store.read_new(f"p{shard}", self.layout.numel[shard], torch.float32)
            tensors = {}
            for slot in self.layout.slots[shard]:
                name = self.stack.hf_name(slot.ref)
                tensors[name] = flat[slot.offset:slot.offset + slot.ref.numel].view(slot.ref.shape).clone()
                weight_map[name] = filename
            total += flat.numel() * FP32
            save_file(tensors, out_dir / filename, metadata={"format": "pt"})
        if n > 1:
            (out_dir / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))

    # -- units ---------------------------------------------------------------------------------------

    def _forward(self, unit: UnitSpec) -> dict[str, Any]:
        """F: shard forward; save the output and the RNG state it started from. Without an autograd
        graph, unless the plan keeps this shard's activations (then the graph is kept in this process)."""
        params = self._load_shard(unit.shard)
        x = self._shard_input(unit)
        self._set_rng("rng")
        self._note_step_start(unit)
        self.store.write(f"r{unit.micro_batch}.{unit.shard}", *_rng_state(self.device))
        if self.plan.shards[unit.shard].keep_activations and not self.layout.lent[unit.shard]:
            out = self._forward_kept(unit, params, x)
        else:
            with torch.no_grad():
                out = self._run_shard(unit.shard, params, x, None, train=True)[0]
        self.store.write("rng", *_rng_state(self.device))
        self.store.write(f"a{unit.micro_batch}.{unit.shard}", out.float())
        return {}

    def _forward_kept(self, unit: UnitSpec, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Forward with a graph whose saved tensors are offloaded by reference (see :class:`_Kept`)."""
        x = x.detach().requires_grad_(x.is_floating_point())
        weights = params.untyped_storage().data_ptr()
        kept = _Kept(out=x, x=x, owned=[])
        on_cpu = self.device.type == "cpu"

        def pack(t: torch.Tensor) -> tuple[Any, ...]:
            if t.untyped_storage().data_ptr() == weights:
                return ("weight", t.storage_offset(), tuple(t.shape), t.stride())
            # detach(): an alias, so that emptying the input leaf or output below does not empty it
            return ("activation", t.detach() if on_cpu else t.to("cpu", non_blocking=True))

        def unpack(handle: tuple[Any, ...]) -> torch.Tensor:
            if handle[0] == "weight":
                assert kept.params is not None, "the backward unit re-points weights before backward"
                return torch.as_strided(kept.params, handle[2], handle[3], handle[1])
            return handle[1] if on_cpu else handle[1].to(self.device, non_blocking=True)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            kept.out, kept.owned, _ = self._run_shard(unit.shard, params, x, None, train=True)
        out = kept.out.detach().clone()
        # Keep only the graph: what backward reads went through pack; the input leaf, the output and the
        # weights are needed for their identity and shape alone, so drop their device memory.
        for tensor in (*kept.owned, kept.x, kept.out):
            tensor.data = torch.empty(0, device=self.device, dtype=tensor.dtype)
        self._kept[(unit.step, unit.micro_batch, unit.shard)] = kept
        return out

    def _forward_backward(self, unit: UnitSpec) -> dict[str, Any]:
        """FB: the last shard's forward, loss and backward in one go (nothing to recompute)."""
        params = self._load_shard(unit.shard)
        x = self._shard_input(unit)
        self._set_rng("rng")
        self._note_step_start(unit)
        loss, owned, lent = self._run_shard(unit.shard, params, x, self._labels(unit), train=True)
        (loss / self.spec.micro_batches).backward()
        self.store.write("rng", *_rng_state(self.device))
        state = self.store.manifest["step_state"]
        state["loss_sum"] += loss.item()
        return self._finish_backward(unit, x, owned, lent)

    def _backward(self, unit: UnitSpec) -> dict[str, Any]:
        """B: backpropagate through the kept graph, or else recompute the shard's forward from its saved
        input and RNG state (bit-identical to the original forward) and backpropagate through that."""
        params = self._load_shard(unit.shard)
        kept = self._kept.pop((unit.step, unit.micro_batch, unit.shard), None)
        if kept is not None:
            kept.params = params
            for slot, param in zip(self.layout.slots[unit.shard], kept.owned, strict=True):
                param.data = params[slot.offset:slot.offset + slot.ref.numel].view(slot.ref.shape)
            ids = self._labels(unit)
            if kept.x.is_floating_point():  # shard 0's input is token ids, never differentiated
                kept.x.data = torch.empty(*ids.shape, self._width, device=self.device)
            kept.out.data = torch.empty(*ids.shape, self._width, device=self.device, dtype=kept.out.dtype)
            out, x, owned, lent = kept.out, kept.x, kept.owned, []
        else:
            x = self._shard_input(unit)
            self._set_rng(f"r{unit.micro_batch}.{unit.shard}")
            out, owned, lent = self._run_shard(unit.shard, params, x, None, train=True)
        grad_out = self._read_boundary(f"d{unit.micro_batch}.{unit.shard}", out.shape)
        torch.autograd.backward(out, grad_out.to(out.dtype))
        return self._finish_backward(unit, x, owned, lent)

    def _evaluate(self, unit: UnitSpec) -> dict[str, Any]:
        """E: evaluation forward of one shard on one validation batch (dropout off, no graph)."""
        params = self._load_shard(unit.shard)
        ids = self.data.eval_batch(batch=unit.micro_batch, batch_size=self.spec.micro_batch_size).to(self.device)
        x = ids if unit.shard == 0 else self._read_boundary(f"e{unit.shard - 1}", (*ids.shape, self._width))
        last = unit.shard == len(self.plan.shards) - 1
        with torch.no_grad():
            out = self._run_shard(unit.shard, params, x, ids if last else None, train=False)[0]
        if not last:
            self.store.write(f"e{unit.shard}", out.float())
            return {}
        state = self.store.manifest["eval_state"]
        state["loss_sum"] += out.item()
        if unit.micro_batch < self.spec.eval_batches - 1:
            return {}
        eval_loss = state["loss_sum"] / self.spec.eval_batches
        state["loss_sum"] = 0.0
        return {"eval_loss": eval_loss, "eval_ppl": math.exp(eval_loss),
                "stopped_early": self._no_longer_improving(unit.step, eval_loss)}

    def _no_longer_improving(self, step: int, eval_loss: float) -> bool:
        """Count evaluations without a new best loss; True when the trial should stop early after ``step``."""
        patience = self.spec.early_stop_patience
        if patience is None:
            return False
        record = self.store.manifest.setdefault("early_stop", {"best": None, "since": 0})
        if record["best"] is None or eval_loss < record["best"]:
            record.update(best=eval_loss, since=0)
        else:
            record["since"] += 1
        return record["since"] >= patience and step < self.spec.steps - 1

    def _final_step(self, unit: UnitSpec) -> dict[str, Any]:
        """S: apply the last step's pending update (only when the trial ends without an evaluation)."""
        self._load_shard(unit.shard)
        return {}

    # -- pieces --------------------------------------------------------------------------------------

    @property
    def _width(self) -> int:
        return self.stack.config.n_embd

    def _labels(self, unit: UnitSpec) -> torch.Tensor:
        batch = self.data.train_batch(seed=self.spec.seed, step=unit.step, batch_size=self.spec.batch_size)
        return batch.chunk(self.spec.micro_batches)[unit.micro_batch].to(self.device)  # (B_mb, T)

    def _shard_input(self, unit: UnitSpec) -> torch.Tensor:
        """Token ids for shard 0, else the saved output of the previous shard (a grad-requiring leaf)."""
        ids = self._labels(unit)
        if unit.shard == 0:
            return ids
        x = self._read_boundary(f"a{unit.micro_batch}.{unit.shard - 1}", (*ids.shape, self._width))
        return x.requires_grad_(unit.phase != "F")

    def _read_boundary(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        return self.store.read_new(name, math.prod(shape), torch.float32).view(*shape).to(self.device)

    def _note_step_start(self, unit: UnitSpec) -> None:
        """Keep the RNG state a step starts from (``rs``): rolling the step back restores it."""
        if unit.micro_batch == 0 and unit.shard == 0:
            self.store.write("rs", *_rng_state(self.device))

    def _set_rng(self, name: str) -> None:
        raw = self.store.read_new(name, sum(self._rng_numel), torch.uint8)
        cpu = self._rng_numel[0]
        torch.set_rng_state(raw[:cpu])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(raw[cpu:], self.device)

    def _load_shard(self, shard: int) -> torch.Tensor:
        """The shard's flat parameters (P,) on the device, after applying its pending optimizer step."""
        params = self._read_state(f"p{shard}")
        meta = self.store.manifest["shards"][shard]
        if meta["pending"]:
            self._step(shard, params)
            meta.update(pending=False, grad="empty")
        return params

    def _step(self, shard: int, params: torch.Tensor) -> None:
        """Clip (global norm, computed when the step's backward finished) and step with torch.optim.

        Both optimizers are elementwise, so the step streams gradients and optimizer state through the
        device ``STEP_CHUNK`` elements at a time; only the parameters are resident whole.
        """
        spec, meta = self.spec.optimizer, self.store.manifest["shards"][shard]
        pending = self.store.manifest["pending"]
        lr = spec.lr * lr_factor(self.spec.schedule, pending["step"], self.spec.steps)
        clip = None
        if spec.clip_norm is not None:  # exactly torch.nn.utils.clip_grad_norm_'s arithmetic
            clip_coef = spec.clip_norm / (torch.tensor(pending["total_norm"], dtype=torch.float32) + 1e-6)
            clip = torch.clamp(clip_coef, max=1.0).to(self.device)
        slots = ["m", "v"][: optimizer_slots(self.spec)]
        has_state = spec.kind == "adamw" or meta["optim_steps"] > 0  # SGD's momentum appears at step 1
        numel = self.layout.numel[shard]
        with contextlib.ExitStack() as stack:
            writers = {slot: stack.enter_context(self.store.writer(f"{slot}{shard}")) for slot in slots}
            for start in range(0, numel, STEP_CHUNK):
                stop = min(numel, start + STEP_CHUNK)
                chunk = params[start:stop]
                chunk.grad = self._read_chunk(f"g{shard}", start, stop)
                if clip is not None:
                    chunk.grad.mul_(clip)
                state = {slot: self._read_chunk(f"{slot}{shard}", start, stop) for slot in slots if has_state}
                optimizer: torch.optim.Optimizer
                if spec.kind == "adamw":
                    optimizer = torch.optim.AdamW([chunk], lr=lr, betas=spec.betas, eps=spec.eps,
                                                  weight_decay=spec.weight_decay)
                    optimizer.state[chunk] = {"step": torch.tensor(float(meta["optim_steps"])),
                                              "exp_avg": state["m"], "exp_avg_sq": state["v"]}
                else:
                    optimizer = torch.optim.SGD([chunk], lr=lr, momentum=spec.momentum,
                                                weight_decay=spec.weight_decay)
                    if state:
                        optimizer.state[chunk] = {"momentum_buffer": state["m"]}
                optimizer.step()
                chunk.grad = None
                if spec.kind == "adamw":
                    writers["m"](state["m"])
                    writers["v"](state["v"])
                elif slots:
                    writers["m"](optimizer.state[chunk]["momentum_buffer"])
        meta["optim_steps"] += 1
        self.store.write(f"p{shard}", params)

    def _read_chunk(self, name: str, start: int, stop: int) -> torch.Tensor:
        tensor = self._transfers.load(self.store.path(name), stop - start, offset=start * FP32)
        self.store.bytes_read += tensor.nbytes
        return tensor

    def _run_shard(self, shard: int, params: torch.Tensor, x: torch.Tensor, labels: torch.Tensor | None, *,
                   train: bool) -> tuple[torch.Tensor, list[nn.Parameter], list[nn.Parameter]]:
        """Bind the shard's weights into its layers and run them; return (output, owned, lent params).

        Owned parameters are views into ``params``; a parameter borrowed from another shard is read from
        that shard's committed buffer. The last layer needs ``labels`` and returns the loss. Units that
        need no graph call this under ``torch.no_grad``.
        """
        plan = self.plan.shards[shard]
        owned = []
        bound: dict[ParamRef, nn.Parameter] = {}
        for slot in self.layout.slots[shard]:
            view = params[slot.offset:slot.offset + slot.ref.numel].view(slot.ref.shape)
            param = self.stack.bind(slot.ref.layer, slot.ref.name, view)
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
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.spec.bf16):
            for index in range(plan.first, plan.stop):
                layer = self.stack.layers[index].train(train)
                x = layer(x, labels) if index == len(self.stack) - 1 else layer(x)
        return x, owned, lent

    def _finish_backward(self, unit: UnitSpec, x: torch.Tensor, owned: list[nn.Parameter],
                         lent: list[nn.Parameter]) -> dict[str, Any]:
        """Accumulate the shard's gradients (plus tied contributions), pass the input gradient on, and
        when the step's backward is complete, record the global gradient norm and mark the step pending."""
        shard, store = unit.shard, self.store
        meta = store.manifest["shards"][shard]
        if unit.shard > 0:
            store.write(f"d{unit.micro_batch}.{unit.shard - 1}", x.grad)
        if lent:
            store.write(f"t{shard}", *(p.grad for p in lent))
        fresh = [p.grad for p in owned]
        slot_index = {slot.ref: i for i, slot in enumerate(self.layout.slots[shard])}
        for slot, borrower, offset in self.layout.incoming(shard):
            contribution = store.read_new(f"t{borrower}", slot.ref.numel, torch.float32, offset=offset * FP32)
            i = slot_index[slot.ref]
            # Autograd would sum both uses of the tied weight before accumulating: do the same.
            fresh[i] = fresh[i] + contribution.view(slot.ref.shape).to(self.device)
        partial = meta["grad"] == "partial"
        flat = self._read_state(f"g{shard}") if partial else torch.empty(self.layout.numel[shard], device=self.device)
        for slot, grad, param in zip(self.layout.slots[shard], fresh, owned, strict=True):
            target = flat[slot.offset:slot.offset + slot.ref.numel]
            if partial:
                target.add_(grad.view(-1))  # old + new, in place, as autograd accumulates .grad
            else:
                target.copy_(grad.view(-1))
            param.grad = None
        store.write(f"g{shard}", flat)
        meta["grad"] = "partial"
        if unit.micro_batch < self.spec.micro_batches - 1:
            return {}
        state = store.manifest["step_state"]
        state["norms"][str(shard)] = [
            torch.linalg.vector_norm(flat[s.offset:s.offset + s.ref.numel], 2.0).item()
            for s in self.layout.slots[shard]
        ]
        if shard > 0:
            return {}
        norms = [n for s in range(len(self.plan.shards)) for n in state["norms"][str(s)]]
        # As clip_grad_norm_: the norm of the per-parameter norms, in model parameter order.
        total_norm = torch.linalg.vector_norm(torch.tensor(norms, dtype=torch.float32), 2.0).item()
        store.manifest["pending"] = {"step": unit.step, "total_norm": total_norm}
        for shard_meta in store.manifest["shards"]:
            shard_meta["pending"] = True
        loss = state["loss_sum"] / self.spec.micro_batches
        store.manifest["step_state"] = {"loss_sum": 0.0, "norms": {}}
        return {
            "loss": loss,
            "lr": self.spec.optimizer.lr * lr_factor(self.spec.schedule, unit.step, self.spec.steps),
            "grad_norm": total_norm,
            "tokens": (unit.step + 1) * self.spec.batch_size * self.spec.data.seq_len,
        }
