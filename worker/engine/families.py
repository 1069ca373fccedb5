"""The decoder-only model families the engine trains, described without torch.

One :class:`Architecture` says everything the engine, the web app's memory preview and the checkpoint
catalog need to know of a model before building it: family, sizes, grouped-query heads, MLP width, tied
head and each family's extra parameters (Qwen2's q/k/v biases, Qwen3's q/k norms). Its per-layer parameter
counts are those of the transformers model the engine builds (tests check them against
``sum(p.numel())`` of the real model), cut into the engine's layers: ``embedding``, ``block.<i>``,
``head`` (final norm + LM head; a tied head *borrows* the embedding's matrix, it does not own it).

An architecture the engine cannot train raises :class:`UnknownArchitecture`, naming it, before any work.
Torch-free: the web process imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from worker.engine.checkpoint_files import checkpoint_dir, checkpoint_file, read_json
from worker.engine.config import ModelSpec
from worker.engine.errors import SpecError
from worker.engine.sizes import stored_bytes

Family = Literal["gpt2", "llama", "mistral", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = get_args(Family)

# The transformers class each family trains as (``architectures`` in its config.json).
CAUSAL_LM_CLASSES: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_FAMILY_OF_CLASS = {cls: family for family, cls in CAUSAL_LM_CLASSES.items()}
# transformers' own defaults where a config.json may leave a field out.
_DEFAULT_TIED = {"gpt2": True, "llama": False, "mistral": False, "qwen2": False, "qwen3": False}


class UnknownArchitecture(SpecError):
    """A model architecture the engine has no adapter for; the message names it and the supported families."""

    def __init__(self, architecture: str | None, model_type: str | None) -> None:
        self.architecture, self.model_type = architecture, model_type
        named = f"architecture {architecture!r}" if architecture else "this architecture"
        if model_type:
            named += f" (model_type {model_type!r})"
        super().__init__(f"The model {named} is not supported; supported: {', '.join(FAMILIES)}")


def default_intermediate(family: str, hidden: int) -> int:
    """The MLP width a family uses when none is given: GPT-2's 4 x hidden; the SwiGLU families' 8/3 x hidden
    rounded up to a multiple of 256 (LLaMA's rule: 4096 -> 11008, SmolLM2's 576 -> 1536)."""
    if family == "gpt2":
        return 4 * hidden
    return 256 * -(-(8 * hidden // 3) // 256)


@dataclass(frozen=True)
class Architecture:
    """A model's shape. ``head_dim`` x ``heads`` need not equal ``hidden`` (Qwen3 configs set it apart)."""

    family: Family
    n_layer: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int
    tied: bool
    head_dim: int
    attention_bias: bool = False  # q/k/v/o biases (Llama, Qwen3 when the config asks)
    mlp_bias: bool = False  # gate/up/down biases (Llama when the config asks)

    @property
    def architecture(self) -> str:
        """The transformers class name, e.g. ``LlamaForCausalLM``."""
        return CAUSAL_LM_CLASSES[self.family]

    def block_params(self) -> int:
        """Parameters of one decoder block."""
        c, i, d = self.hidden, self.intermediate, self.head_dim
        if self.family == "gpt2":
            return 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * i + i) + (i * c + c)
        q, kv = self.heads * d, self.kv_heads * d
        attention = c * q + 2 * c * kv + q * c
        if self.family == "qwen2":  # q, k and v always carry a bias; o does not
            attention += q + 2 * kv
        elif self.attention_bias:
            attention += q + 2 * kv + c
        if self.family == "qwen3":  # RMSNorm over the head dimension on queries and keys
            attention += 2 * d
        mlp = 3 * c * i + ((2 * i + c) if self.mlp_bias else 0)
        return 2 * c + attention + mlp

    def layer_params(self) -> list[tuple[str, int, int]]:
        """Per engine layer: (name, parameters it owns, parameters it borrows from an earlier layer)."""
        c, v = self.hidden, self.vocab
        embedding = v * c + (self.context * c if self.family == "gpt2" else 0)
        final_norm = 2 * c if self.family == "gpt2" else c
        head = (final_norm, v * c) if self.tied else (final_norm + v * c, 0)
        block = self.block_params()
        return [("embedding", embedding, 0), *((f"block.{i}", block, 0) for i in range(self.n_layer)), ("head", *head)]

    @property
    def n_params(self) -> int:
        """Distinct parameters of the model (a tied matrix counted once), as ``sum(p.numel())`` counts them."""
        return sum(owned for _, owned, _ in self.layer_params())

    def block_linears(self) -> list[tuple[str, int, int]]:
        """The linear modules of one decoder block that LoRA may adapt: (name, in features, out features).

        GPT-2's are ``Conv1D`` (fan-in, fan-out weights), and its ``c_proj`` name covers two modules, the
        attention's output (c -> c) and the MLP's (i -> c), as a LoRA target name covers both."""
        c, i, d = self.hidden, self.intermediate, self.head_dim
        if self.family == "gpt2":
            return [("c_attn", c, 3 * c), ("c_proj", c, c), ("c_fc", c, i), ("c_proj", i, c)]
        q, kv = self.heads * d, self.kv_heads * d
        return [("q_proj", c, q), ("k_proj", c, kv), ("v_proj", c, kv), ("o_proj", q, c),
                ("gate_proj", c, i), ("up_proj", c, i), ("down_proj", i, c)]

    def layer_matrices(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """Per engine layer: the shapes of its weight matrices (a tied head's included: a LoRA trial's head reads
        it from the base), as the model stores them, the token embedding first; the rest of its parameters are
        vectors."""
        c, v = self.hidden, self.vocab
        gpt2 = self.family == "gpt2"
        embedding = [(v, c), *([(self.context, c)] if gpt2 else [])]
        block = [(n_in, n_out) if gpt2 else (n_out, n_in) for _, n_in, n_out in self.block_linears()]
        return [("embedding", embedding), *((f"block.{i}", block) for i in range(self.n_layer)),
                ("head", [(v, c)])]

    def frozen_layer_bytes(self, base_dtype: str) -> list[int]:
        """Per engine layer of a LoRA trial, the bytes of the frozen weights it reads from a base stored at
        ``base_dtype`` (:func:`worker.engine.sizes.stored_bytes` of each matrix, the token embedding and the head
        as ``vocabulary`` matrices; vectors as that function keeps them)."""
        out = []
        for (name, matrices), (_, _, frozen) in zip(self.layer_matrices(), self.lora_layer_params(r=1, targets=()),
                                                    strict=True):
            vectors = frozen - sum(rows * cols for rows, cols in matrices)
            vocabulary = [name == "head" or (name, k) == ("embedding", 0) for k in range(len(matrices))]
            matrix_bytes = sum(stored_bytes(shape, base_dtype, vocabulary=vocab)
                               for shape, vocab in zip(matrices, vocabulary, strict=True))
            out.append(matrix_bytes + stored_bytes((vectors,), base_dtype))
        return out

    def base_bytes(self, base_dtype: str) -> int:
        """Bytes of the host's one shared base of this model at ``base_dtype`` (a tied matrix stored once)."""
        layers = self.frozen_layer_bytes(base_dtype)
        tied = stored_bytes((self.vocab, self.hidden), base_dtype, vocabulary=True) if self.tied else 0
        return sum(layers) - tied

    def lora_targets(self) -> tuple[str, ...]:
        """The module names a LoRA trial of this family may target (the blocks' linears and the LM head)."""
        return (*dict.fromkeys(name for name, _, _ in self.block_linears()), "lm_head")

    def lora_layer_params(self, *, r: int, targets: tuple[str, ...]) -> list[tuple[str, int, int]]:
        """Per engine layer of a LoRA trial of rank ``r`` on ``targets``: (name, adapter parameters it trains,
        frozen base parameters it reads).

        Each targeted linear module of shape in x out gets peft's two adapter matrices, A (r x in) and B
        (out x r): ``r * (in + out)`` parameters, no bias. Every base weight a layer registers is frozen, a tied
        head's matrix too (it reads the embedding's from the shared base), so the frozen counts add up to more
        than `n_params` when the head is tied; the host's base stores that matrix once."""
        wanted = set(targets)
        block = sum(r * (n_in + n_out) for name, n_in, n_out in self.block_linears() if name in wanted)
        head = r * (self.hidden + self.vocab) if "lm_head" in wanted else 0
        adapters = {"embedding": 0, "head": head}
        return [(name, adapters.get(name, block), owned + borrowed)
                for name, owned, borrowed in self.layer_params()]


def _family(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures and isinstance(architectures[0], str) else None
    if model_type in FAMILIES:
        return str(model_type)
    if model_type is None and architecture in _FAMILY_OF_CLASS:
        return _FAMILY_OF_CLASS[architecture]
    raise UnknownArchitecture(architecture, model_type if isinstance(model_type, str) else None)


def _int(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"config.json: {key} must be a positive integer, got {value!r}")
            return value
    if default is None:
        raise SpecError(f"config.json has no {' or '.join(keys)}")
    return default


def architecture_from_config(config: dict[str, Any]) -> Architecture:
    """The architecture a transformers ``config.json`` (as a dict) describes; ``UnknownArchitecture`` for a
    family the engine does not train, ``SpecError`` for a missing or malformed size."""
    if not isinstance(config, dict):
        raise SpecError("config.json must hold a JSON object")
    family = _family(config)
    if family == "gpt2":
        hidden, heads = _int(config, "n_embd", "hidden_size"), _int(config, "n_head", "num_attention_heads")
        return Architecture(
            family="gpt2", n_layer=_int(config, "n_layer", "num_hidden_layers"), hidden=hidden, heads=heads,
            kv_heads=heads, intermediate=_int(config, "n_inner", default=4 * hidden),
            vocab=_int(config, "vocab_size"), context=_int(config, "n_positions", "max_position_embeddings"),
            tied=bool(config.get("tie_word_embeddings", True)), head_dim=hidden // heads,
        )
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", default=8 if family == "mistral" else heads)
    if heads % kv_heads:
        raise SpecError(f"config.json: {kv_heads} key/value heads do not divide {heads} attention heads")
    # Qwen3's config has a fixed head_dim default of 128; the others derive it from the width.
    head_dim = _int(config, "head_dim", default=128 if family == "qwen3" else hidden // heads)
    return Architecture(
        family=family,  # type: ignore[arg-type]
        n_layer=_int(config, "num_hidden_layers"), hidden=hidden, heads=heads, kv_heads=kv_heads,
        intermediate=_int(config, "intermediate_size"), vocab=_int(config, "vocab_size"),
        context=_int(config, "max_position_embeddings"),
        tied=bool(config.get("tie_word_embeddings", _DEFAULT_TIED[family])), head_dim=head_dim,
        attention_bias=family in ("llama", "qwen3") and bool(config.get("attention_bias", False)),
        mlp_bias=family == "llama" and bool(config.get("mlp_bias", False)),
    )


def read_config(directory: Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict; ``SpecError`` when it is missing or not JSON, ``CheckpointError``
    (a ``SpecError``) when the directory or the file leads elsewhere through a symbolic link or the file is
    over `CHECKPOINT_JSON_MAX_BYTES` (`worker.engine.checkpoint_files`)."""
    path = checkpoint_file(checkpoint_dir(directory), "config.json")
    if not path.is_file():
        raise SpecError(f"{directory} has no config.json")
    config = read_json(path)
    if not isinstance(config, dict):
        raise SpecError(f"{path} must hold a JSON object")
    return config


def architecture_from_spec(spec: ModelSpec) -> Architecture:
    """The architecture the engine builds for ``spec`` (its pretrained directory's config when it has one)."""
    if spec.pretrained_dir is not None:
        return architecture_from_config(read_config(Path(spec.pretrained_dir)))
    if spec.family not in FAMILIES:
        raise UnknownArchitecture(None, spec.family)
    return Architecture(
        family=spec.family, n_layer=spec.n_layer, hidden=spec.n_embd, heads=spec.n_head,
        kv_heads=spec.n_kv_head or spec.n_head,
        intermediate=spec.n_inner or default_intermediate(spec.family, spec.n_embd), vocab=spec.vocab_size,
        context=spec.n_positions, tied=spec.tie_word_embeddings, head_dim=spec.n_embd // spec.n_head,
    )
