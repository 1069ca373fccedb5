"""Typed, JSON-round-trippable configuration of one trial.

Everything the engine needs arrives here; the engine never reads the environment. Paths are kept as
``str`` so that a spec serializes into the spill store's manifest unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from worker.engine.errors import SpecError
from worker.engine.sizes import BASE_DTYPES


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only causal LM of one ``family``: built from the size fields or loaded from ``pretrained_dir``.

    ``pretrained_dir`` is a local ``save_pretrained`` directory with safetensors weights (read with
    ``local_files_only``); when set, the size and family fields are ignored and its config wins (family,
    dropout and tied head included). ``n_kv_head`` is the number of key/value heads of grouped-query
    attention (``None``: one per query head; GPT-2 has none), ``n_inner`` the MLP width (``None``: the family's
    default, :func:`worker.engine.families.default_intermediate`). ``dropout`` is GPT-2's embedding, attention
    and residual dropout and the other families' attention dropout (the only dropout they have).
    ``base_dtype`` is the precision a LoRA trial's frozen base is stored in, on the host and on its way to the
    device (:mod:`worker.engine.base_formats`: ``fp32``, ``bf16``, ``int8``, ``nf4``); a full fine-tune trains
    fp32 master weights and takes ``fp32`` only.
    """

    family: Literal["gpt2", "llama", "mistral", "qwen2", "qwen3"] = "gpt2"
    n_layer: int = 4
    n_embd: int = 32
    n_head: int = 4
    n_kv_head: int | None = None
    n_inner: int | None = None
    vocab_size: int = 256
    n_positions: int = 32
    dropout: float = 0.1
    tie_word_embeddings: bool = True
    pretrained_dir: str | None = None
    base_dtype: Literal["fp32", "bf16", "int8", "nf4"] = "fp32"

    def __post_init__(self) -> None:
        if self.base_dtype not in BASE_DTYPES:
            raise SpecError(f"base_dtype {self.base_dtype!r} is not one of {', '.join(BASE_DTYPES)}")
        if self.pretrained_dir is not None:
            return
        families = ("gpt2", "llama", "mistral", "qwen2", "qwen3")
        if self.family not in families:
            raise SpecError(f"model family {self.family!r} is not supported; supported: {', '.join(families)}")
        if self.n_head < 1 or self.n_embd % self.n_head:
            raise SpecError(f"n_embd {self.n_embd} does not split into {self.n_head} attention heads")
        if self.n_kv_head is not None:
            if self.family == "gpt2" and self.n_kv_head != self.n_head:
                raise SpecError("GPT-2 has no grouped-query attention: n_kv_head must be unset or equal n_head")
            if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
                raise SpecError(f"n_kv_head {self.n_kv_head} must divide n_head {self.n_head}")
        if self.n_inner is not None and self.n_inner < 1:
            raise SpecError(f"n_inner must be at least 1, got {self.n_inner}")


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """LoRA adapters as the ``peft`` library defines them (``peft.LoraConfig``): rank ``r``, scaling
    ``alpha / r``, ``dropout`` on each adapter's input, on the linear modules whose names end with one of
    ``target_modules`` (``q_proj``, ``v_proj``; GPT-2's fused ``c_attn``). Only the adapters train; the base
    model's weights stay frozen and are shared by every trial on the same checkpoint (see
    :mod:`worker.engine.shared_base`)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise SpecError(f"LoRA rank r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise SpecError(f"LoRA alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise SpecError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(m, str) and m.isidentifier() for m in self.target_modules):
            raise SpecError(f"LoRA target_modules must be module names such as q_proj, got {self.target_modules!r}")


DPO_LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(frozen=True, kw_only=True)
class DpoSpec:
    """Direct preference optimization on preference pairs (:mod:`worker.engine.dpo`), as TRL's ``DPOTrainer``
    defines it: ``beta`` weighs the implicit reward ``beta * (log pi(answer) - log pi_ref(answer))`` of each answer
    (its answer tokens' summed log-probability under the trained model and under the reference: the starting
    weights, or a LoRA trial's base with its adapters off); ``loss_type`` ``sigmoid`` is DPO's
    ``-log sigmoid(r_chosen - r_rejected)``, ``ipo`` IPO's squared distance of the log-ratio difference, each
    answer's log-ratio per answer token, from ``1 / (2 beta)``."""

    beta: float = 0.1
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, int | float) or not 0 < self.beta < math.inf:
            raise SpecError(f"DPO beta must be a positive number, got {self.beta!r}")
        if self.loss_type not in DPO_LOSS_TYPES:
            raise SpecError(f"DPO loss_type {self.loss_type!r} is not one of {', '.join(DPO_LOSS_TYPES)}")


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """``torch.optim.AdamW`` or ``torch.optim.SGD`` (with momentum) hyperparameters, plus clipping.

    ``clip_norm`` is the max global L2 norm of all gradients (``torch.nn.utils.clip_grad_norm_``
    semantics); ``None`` disables clipping. Weight decay applies to every parameter, as with a plain
    ``AdamW(model.parameters())``.
    """

    kind: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    momentum: float = 0.9
    clip_norm: float | None = 1.0


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """Learning-rate multiplier: linear warm-up from 0, then constant, linear or cosine decay to 0.

    Same definitions as ``transformers.get_{constant,linear,cosine}_schedule_with_warmup``
    (see :func:`worker.engine.schedule.lr_factor`).
    """

    warmup_steps: int = 0
    decay: Literal["constant", "linear", "cosine"] = "cosine"


@dataclass(frozen=True, kw_only=True)
class ContinuationSpec:
    """Steps added to a trial after it ended: ``steps`` more optimizer steps from step ``after`` (the steps it
    had trained: all of its schedule, or fewer if it stopped early or was pruned), at peak learning rate
    ``lr`` with its own warm-up and decay over its own ``steps`` (:func:`worker.engine.schedule.step_lr`)."""

    after: int
    steps: int
    lr: float
    warmup_steps: int = 0
    decay: Literal["constant", "linear", "cosine"] = "cosine"

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise SpecError(f"a continuation adds at least one step, got {self.steps}")
        if not self.lr > 0:
            raise SpecError(f"a continuation's learning rate must be positive, got {self.lr}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise SpecError(f"a continuation's warmup_steps must be from 0 to its {self.steps} steps, "
                            f"got {self.warmup_steps}")
        if self.decay not in ("constant", "linear", "cosine"):
            raise SpecError(f"decay {self.decay!r} is not constant, linear or cosine")


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Packed token blocks: ``tokens_path`` is a 1-D ``.npy`` of token ids (see :mod:`worker.engine.data`).

    The validation split is the tokens from ``val_start`` on (the token where the dataset's held-out text
    begins, the same text for every tokenizer), or, without ``val_start``, the last ``val_fraction`` of the
    blocks (at least one). ``tokenizer_dir`` is the
    directory of the tokenizer that made the tokens (a bare ``tokenizer.json`` or a ``save_pretrained``
    tokenizer); the export copies it so that the exported directory loads with ``AutoTokenizer``.
    ``token_bytes_path`` is a 1-D ``.npy`` as long as the tokens: the UTF-8 bytes of text each token covers,
    so that evaluations report bits per byte. ``holdout_tokens`` (with ``val_start``) declares the held-out
    set: the final evaluation covers exactly the tokens ``val_start .. val_start + holdout_tokens``.

    Instruction and chat data come as examples instead (:mod:`worker.engine.examples`): ``examples_dir`` holds
    a tokenized example set, whose first ``train_examples`` examples train and the rest validate; rows are
    ``seq_len`` tokens, one example each or ``packing`` several, and the loss covers the tokens ``loss_on``
    names (:class:`worker.engine.chat.LossOn`). ``holdout_rows`` declares the held-out set: the final
    evaluation covers the validation examples that fit ``seq_len``, one a row, and there are that many (the
    engine checks). ``chat_template`` is the template the examples were rendered with when the tokenizer does
    not carry it itself; the export writes it into the tokenizer. A spec names token blocks or examples, not
    both.

    ``pairs``: the example set holds preference pairs (:mod:`worker.engine.pairs`), for a trial with ``dpo``:
    an example is then a pair (``train_examples`` counts pairs), laid out as two rows, its chosen sequence above
    its rejected one, and ``holdout_rows`` counts those rows (two per held-out pair that fits). The loss covers
    the answers, so ``loss_on`` stays ``assistant``.
    """

    tokens_path: str = ""
    seq_len: int = 32
    val_fraction: float = 0.1
    tokenizer_dir: str | None = None
    val_start: int | None = None
    token_bytes_path: str | None = None
    holdout_tokens: int | None = None
    examples_dir: str | None = None
    train_examples: int | None = None
    packing: bool = False
    loss_on: Literal["assistant", "last", "all"] = "assistant"
    holdout_rows: int | None = None
    chat_template: str | None = None
    pairs: bool = False

    EXAMPLE_FIELDS = ("examples_dir", "train_examples", "packing", "loss_on", "holdout_rows", "chat_template", "pairs")

    def __post_init__(self) -> None:
        if bool(self.tokens_path) == (self.examples_dir is not None):
            raise SpecError("a trial's data is token blocks (tokens_path) or examples (examples_dir): set one")
        if self.examples_dir is not None:
            if self.train_examples is None or self.train_examples < 1:
                raise SpecError(f"examples need train_examples of at least 1, got {self.train_examples}")
            if self.holdout_tokens is not None or self.val_start is not None:
                raise SpecError("examples hold out whole examples (train_examples), not tokens")
            if self.holdout_rows is not None and self.holdout_rows < 1:
                raise SpecError(f"holdout_rows must be at least 1, got {self.holdout_rows}")
        if self.loss_on not in ("assistant", "last", "all"):
            raise SpecError(f"loss_on {self.loss_on!r} is not one of assistant, last, all")
        if self.pairs and (self.examples_dir is None or self.loss_on != "assistant"):
            raise SpecError("preference pairs are examples (examples_dir) whose answers the loss covers: "
                            f"loss_on must stay 'assistant', got {self.loss_on!r}")
        if self.val_start is not None and self.val_start < 1:
            raise SpecError(f"val_start must be a token index of at least 1, got {self.val_start}")
        if self.holdout_tokens is not None and (self.val_start is None or self.holdout_tokens < 2):
            raise SpecError(f"holdout_tokens={self.holdout_tokens} needs val_start and at least 2 tokens "
                            "(a block's first token is not predicted)")

    def final_eval_batches(self, micro_batch_size: int) -> int:
        """Micro-batches of the final evaluation: the held-out tokens in blocks of ``seq_len``, at most
        ``micro_batch_size`` blocks a batch, then a last, shorter block of the rest in a batch of its own (if
        it predicts a token); for examples, ``holdout_rows`` rows in batches of ``micro_batch_size``; 0 without
        either."""
        if self.holdout_rows is not None:
            return -(-self.holdout_rows // micro_batch_size)
        if self.holdout_tokens is None:
            return 0
        full, rest = divmod(self.holdout_tokens, self.seq_len)
        return -(-full // micro_batch_size) + (rest >= 2)


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One trial: model, data, optimization and the device memory budget.

    ``batch_size`` sequences per optimizer step, split into ``micro_batches`` equal micro-batches whose
    gradients are accumulated. Every ``eval_every`` steps (and after the last one) the model is evaluated
    on ``eval_batches`` validation micro-batches; ``eval_every=0`` disables evaluation.
    ``budget_bytes`` bounds the device memory of one unit plus the prefetched next shard.
    ``bf16`` turns on bf16 autocast (CUDA only) with fp32 master weights. ``activations="auto"`` keeps a
    shard's forward activations for its backward unit when that is measured to be cheaper than recomputing
    them (see :func:`worker.engine.partition.choose_kept`); ``"recompute"`` always recomputes.
    ``lora``: train LoRA adapters on the pretrained model instead of all its weights (``None``: full training).
    ``early_stop_patience``: end the trial after that many evaluations in a row without a lower validation
    loss than the best so far (its weights are those of the last step; ``None`` trains every step).
    With ``data.holdout_tokens`` a trial ends with a final evaluation on the whole declared held-out set
    (:attr:`final_eval_batches` micro-batches), also when it stops early.
    ``continuations``: segments of steps added after the trial ended, in order (see :class:`ContinuationSpec`);
    the trial trains ``total_steps``, each segment under its own learning-rate schedule, and every segment's
    last step evaluates (or, without evaluations, applies its update at once) as the last step of a trial does.
    ``dpo``: train on preference pairs (``data.pairs``) with DPO's loss instead of the language-modelling loss
    (``None``); a batch is still ``batch_size`` rows, a pair two of them in the same micro-batch, so
    ``micro_batch_size`` is even.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    batch_size: int = 8
    micro_batches: int = 1
    steps: int = 20
    eval_every: int = 0
    eval_batches: int = 2
    seed: int = 0
    budget_bytes: int = 1 << 30
    bf16: bool = False
    activations: Literal["auto", "recompute"] = "auto"
    early_stop_patience: int | None = None
    lora: LoraSpec | None = None
    continuations: tuple[ContinuationSpec, ...] = ()
    dpo: DpoSpec | None = None

    def __post_init__(self) -> None:
        if self.lora is not None and self.model.pretrained_dir is None:
            raise SpecError("LoRA trains adapters on a pretrained model: set model.pretrained_dir")
        if self.lora is None and self.model.base_dtype != "fp32":
            raise SpecError(f"base_dtype {self.model.base_dtype} stores a frozen base, and a full fine-tune freezes "
                            "nothing: it trains fp32 master weights (bf16 computes under autocast with them). Use "
                            "base_dtype fp32, or train LoRA adapters on the base")
        if self.batch_size % self.micro_batches:
            raise SpecError(
                f"batch_size {self.batch_size} does not split into {self.micro_batches} equal micro-batches"
            )
        if self.steps < 1:
            raise SpecError(f"steps must be at least 1, got {self.steps}")
        if (self.dpo is not None) != self.data.pairs:
            raise SpecError("DPO trains on preference pairs and preference pairs train with DPO: set both dpo and "
                            "data.pairs, or neither")
        if self.dpo is not None and self.micro_batch_size % 2:
            raise SpecError(f"a DPO micro-batch holds whole pairs, two rows each: batch_size {self.batch_size} in "
                            f"{self.micro_batches} micro-batches gives {self.micro_batch_size} rows, an odd number")
        if self.eval_every < 0 or (self.eval_every and self.eval_batches < 1):
            raise SpecError(f"eval_every={self.eval_every} needs eval_batches >= 1, got {self.eval_batches}")
        if self.early_stop_patience is not None and (self.early_stop_patience < 1 or not self.eval_every):
            raise SpecError(f"early_stop_patience={self.early_stop_patience} needs to be at least 1 and "
                            f"evaluations to count (eval_every={self.eval_every})")
        start, length = 0, self.steps
        for added in self.continuations:
            if not start < added.after <= start + length:
                raise SpecError(f"a continuation after step {added.after} must start after the previous segment's "
                                f"first step {start} and by its end {start + length}")
            start, length = added.after, added.steps

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole trial, added segments included."""
        if not self.continuations:
            return self.steps
        return self.continuations[-1].after + self.continuations[-1].steps

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches

    @property
    def final_eval_batches(self) -> int:
        """Micro-batches of the final evaluation (0: the trial has none; see :class:`DataSpec`)."""
        return self.data.final_eval_batches(self.micro_batch_size)

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        if not self.continuations:  # the form of a trial never continued stays what it always was
            del raw["continuations"]
        if self.dpo is None:  # and so does that of a language-modelling trial
            del raw["dpo"]
            raw["data"].pop("pairs")
        if self.data.examples_dir is None:  # and of a trial on token blocks
            for name in DataSpec.EXAMPLE_FIELDS:
                raw["data"].pop(name, None)
        if self.model.base_dtype == "fp32":  # and of a trial on an fp32 base
            del raw["model"]["base_dtype"]
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialSpec:
        raw = dict(raw)
        optimizer = dict(raw.pop("optimizer"))
        optimizer["betas"] = tuple(optimizer["betas"])
        lora = raw.pop("lora", None)
        if lora is not None:
            lora = LoraSpec(**lora | {"target_modules": tuple(lora["target_modules"])})
        continuations = tuple(ContinuationSpec(**added) for added in raw.pop("continuations", ()))
        dpo = raw.pop("dpo", None)
        return cls(
            lora=lora,
            dpo=None if dpo is None else DpoSpec(**dpo),
            continuations=continuations,
            model=ModelSpec(**raw.pop("model")),
            data=DataSpec(**raw.pop("data")),
            optimizer=OptimizerSpec(**optimizer),
            schedule=ScheduleSpec(**raw.pop("schedule")),
            **raw,
        )
