"""Which model a trial trains: a family preset, a custom size of a family, a catalog checkpoint, or (in
experiments stored before the catalog) a pretrained directory under the models root.

Pure apart from reading a checkpoint's row and a model directory's ``config.json`` and tokenizer fingerprint
(never its weights, never torch). A pretrained model's architecture comes from its config through the engine's
`worker.engine.families`, the one reader the engine itself uses, so the web app plans the model the engine
will build; its tokenizer decides the dataset's token ids (`tokenizer_sha256`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError

from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import checkpoint_dir, ready_checkpoints
from webapp.experiments.search_space import quote
from webapp.worker_door import (
    BASE_DTYPES,
    CHECKPOINT_JSON_MAX_BYTES,
    FAMILIES,
    TOKENIZER_JSON,
    Architecture,
    CheckpointFileTooLarge,
    CheckpointLinkError,
    SpecError,
    architecture_from_config,
    checkpoint_file,
    default_intermediate,
    read_limited,
)

MAX_CONFIG_BYTES = CHECKPOINT_JSON_MAX_BYTES  # the most of a config.json the engine reads, and so the web app
BASE_DTYPE_NEEDS_A_CHECKPOINT = ("base_dtype: a low-bit base is the frozen weights of a pretrained checkpoint under "
                                 "LoRA; a model trained from scratch trains every weight in fp32. Choose fp32.")
FAMILY_LABELS = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}


class ModelChoiceError(ValueError):
    """A model that cannot be used; ``field`` names the form field at fault."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A model's shape. ``vocab_size`` 0 means "the dataset's tokenizer's vocabulary" (a model from scratch).

    A pretrained model has ``pretrained_dir`` and, when it carries a tokenizer, ``tokenizer_sha256``: its
    trials train on the dataset tokenized with that tokenizer (``tokenizer_dir``), never the dataset's own.
    ``base_dtype`` is the precision its LoRA trials keep the frozen base in (the engine's ``ModelSpec``'s).
    """

    family: str = "gpt2"
    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int
    n_kv_head: int | None = None
    n_inner: int | None = None
    tie_word_embeddings: bool = True
    vocab_size: int = 0
    pretrained_dir: str | None = None
    tokenizer_sha256: str | None = None
    tokenizer_dir: str | None = None
    model_name: str = ""
    base_dtype: str = "fp32"

    def with_params(self, params: dict[str, Any], *, vocab_size: int) -> ModelShape:
        """The shape of one trial: searched width/depth override the base, the dataset fixes the vocabulary."""
        return replace(
            self,
            n_layer=int(params.get("n_layer") or self.n_layer),
            n_embd=int(params.get("n_embd") or self.n_embd),
            vocab_size=self.vocab_size or vocab_size,
        )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    def architecture(self) -> Architecture:
        """The engine's description of this shape (its vocabulary must be known: see `with_params`)."""
        return Architecture(
            family=self.family,  # type: ignore[arg-type]
            n_layer=self.n_layer, hidden=self.n_embd, heads=self.n_head, kv_heads=self.kv_heads,
            intermediate=self.n_inner or default_intermediate(self.family, self.n_embd), vocab=self.vocab_size,
            context=self.n_positions, tied=self.tie_word_embeddings, head_dim=self.n_embd // self.n_head,
        )


def _llama(n_layer: int, n_embd: int, n_head: int, n_kv_head: int, n_inner: int, n_positions: int, *,
           tied: bool = True) -> ModelShape:
    return ModelShape(family="llama", n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_kv_head=n_kv_head,
                      n_inner=n_inner, n_positions=n_positions, tie_word_embeddings=tied)


# GPT-2's published sizes (small..xl), Llama-style shapes of published models (trained from scratch here, on
# the dataset's tokenizer), and two small ones of each family that train on a CPU in seconds.
PRESETS: dict[str, tuple[str, ModelShape]] = {
    "gpt2-micro": ("GPT-2 micro (2 layers, 64 wide; tests and demos)",
                   ModelShape(n_layer=2, n_embd=64, n_head=2, n_positions=256)),
    "gpt2-tiny": ("GPT-2 tiny (4 layers, 128 wide)", ModelShape(n_layer=4, n_embd=128, n_head=4, n_positions=512)),
    "gpt2": ("GPT-2 small (124M: 12 layers, 768 wide)", ModelShape(n_layer=12, n_embd=768, n_head=12,
                                                                  n_positions=1024)),
    "gpt2-medium": ("GPT-2 medium (355M: 24 layers, 1024 wide)",
                    ModelShape(n_layer=24, n_embd=1024, n_head=16, n_positions=1024)),
    "gpt2-large": ("GPT-2 large (774M: 36 layers, 1280 wide)",
                   ModelShape(n_layer=36, n_embd=1280, n_head=20, n_positions=1024)),
    "gpt2-xl": ("GPT-2 XL (1.5B: 48 layers, 1600 wide)",
                ModelShape(n_layer=48, n_embd=1600, n_head=25, n_positions=1024)),
    "llama-micro": ("Llama micro (2 layers, 64 wide, 4 heads sharing 2 key/value heads; tests and demos)",
                    _llama(2, 64, 4, 2, 128, 256)),
    "llama-tiny": ("Llama tiny (4 layers, 128 wide, 4 heads, 2 key/value heads)", _llama(4, 128, 4, 2, 384, 512)),
    "smollm2-135m": ("SmolLM2-135M shape (30 layers, 576 wide, 9 heads, 3 key/value heads)",
                     _llama(30, 576, 9, 3, 1536, 8192)),
    "llama-1b": ("Llama 3.2 1B shape (16 layers, 2048 wide, 32 heads, 8 key/value heads)",
                 _llama(16, 2048, 32, 8, 8192, 8192)),
    "llama-3b": ("Llama 3.2 3B shape (28 layers, 3072 wide, 24 heads, 8 key/value heads)",
                 _llama(28, 3072, 24, 8, 8192, 8192)),
    "llama-7b": ("Llama 2 7B shape (32 layers, 4096 wide, 32 heads, untied head)",
                 _llama(32, 4096, 32, 32, 11008, 4096, tied=False)),
}


def resolve_pretrained_dir(relative: str, *, models_root: Path) -> Path:
    """The directory `relative` under `models_root`, resolved; ModelChoiceError if it escapes the root.

    Absolute paths, ``..`` and symbolic links that lead outside the root are all refused, because the worker
    would read whatever this returns.
    """
    text = relative.strip()
    if not text:
        raise ModelChoiceError("Give the model's directory, relative to the models root.", field="pretrained_dir")
    root = models_root.resolve()
    candidate = (root / text).resolve()
    if Path(text).is_absolute() or not candidate.is_relative_to(root) or candidate == root:
        raise ModelChoiceError(
            f"{text!r} is not inside the models root {root}; give a directory relative to it.",
            field="pretrained_dir",
        )
    if not candidate.is_dir():
        raise ModelChoiceError(f"There is no directory {text!r} under the models root.", field="pretrained_dir")
    return candidate


def pretrained_shape(directory: Path, *, field: str = "pretrained_dir") -> ModelShape:
    """The shape from a ``save_pretrained`` directory's ``config.json`` (read only if under 1 MiB), of any
    family the engine trains, with its tokenizer's fingerprint when it has a ``tokenizer.json``. A file that a
    symbolic link leads out of the directory is refused, not read."""
    try:
        config = json.loads(read_limited(checkpoint_file(directory, "config.json"), limit=MAX_CONFIG_BYTES))
        if not isinstance(config, dict):
            raise ModelChoiceError(f"{directory.name}/config.json is not a JSON object.", field=field)
        model_type = config.get("model_type")
        if model_type not in FAMILIES:
            raise ModelChoiceError(
                f"{directory.name} has model_type {quote(model_type)}; Hydra trains {', '.join(FAMILIES)} models.",
                field=field,
            )
        arch = architecture_from_config(config)
        return ModelShape(
            family=arch.family, n_layer=arch.n_layer, n_embd=arch.hidden, n_head=arch.heads,
            n_kv_head=arch.kv_heads, n_inner=arch.intermediate, tie_word_embeddings=arch.tied,
            n_positions=arch.context, vocab_size=arch.vocab, pretrained_dir=str(directory),
            tokenizer_sha256=tokenizer_fingerprint(directory), tokenizer_dir=str(directory),
            model_name=directory.name,
        )
    except ModelChoiceError:
        raise
    except CheckpointFileTooLarge:
        raise ModelChoiceError(f"{directory.name}/config.json is over {MAX_CONFIG_BYTES >> 20} MiB; a model "
                               "config is a few kilobytes.", field=field) from None
    except CheckpointLinkError as error:
        raise ModelChoiceError(f"{directory.name}/{error.path.name} leads out of the model's directory (a symbolic "
                               "link); a model is read only from its own files.", field=field) from None
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError, SpecError) as error:
        # RecursionError: JSON nested deeper than the parser goes; OverflowError: int(Infinity).
        detail = str(error)[:120] if not isinstance(error, RecursionError) else "nested too deep"
        raise ModelChoiceError(f"{directory.name} has no readable config.json ({detail}).", field=field) from None


def tokenizer_fingerprint(directory: Path) -> str | None:
    """sha256 of the directory's ``tokenizer.json``, or None when it has none; ``CheckpointLinkError`` when a
    symbolic link leads it out of the directory."""
    path = checkpoint_file(directory, TOKENIZER_JSON)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _file_sha256(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, mtime_ns: int, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_shape(checkpoint_id: object) -> ModelShape:
    """The shape of a ready catalog checkpoint: its directory's config, its catalog name and tokenizer."""
    try:
        checkpoint = ready_checkpoints().get(pk=int(checkpoint_id))  # type: ignore[call-overload]
    except (Checkpoint.DoesNotExist, TypeError, ValueError):
        raise ModelChoiceError("Choose a ready checkpoint of the catalog; this one is not (or no longer) there.",
                               field="checkpoint") from None
    try:
        directory = checkpoint_dir(checkpoint)
    except ValidationError as error:
        raise ModelChoiceError(" ".join(error.messages), field="checkpoint") from None
    shape = pretrained_shape(directory, field="checkpoint")
    return replace(shape, model_name=checkpoint.name, n_positions=checkpoint.context_length or shape.n_positions,
                   tokenizer_sha256=checkpoint.tokenizer_sha256 or shape.tokenizer_sha256)


def _custom_shape(model: dict[str, Any]) -> ModelShape:
    family = str(model.get("family") or "gpt2")
    if family not in FAMILIES:
        raise ModelChoiceError(f"Unknown family {quote(family)}; choose one of {', '.join(FAMILIES)}.",
                               field="family")
    n_kv_head = int(model["n_kv_head"]) if model.get("n_kv_head") else None
    shape = ModelShape(family=family, n_layer=int(model["n_layer"]), n_embd=int(model["n_embd"]),
                       n_head=int(model["n_head"]), n_positions=int(model["n_positions"]), n_kv_head=n_kv_head,
                       n_inner=int(model["n_inner"]) if model.get("n_inner") else None)
    if shape.n_embd % shape.n_head:
        raise ModelChoiceError(
            f"The width {shape.n_embd} does not split into {shape.n_head} heads; make it a multiple.", field="n_embd",
        )
    if n_kv_head is not None:
        if family == "gpt2" and n_kv_head != shape.n_head:
            raise ModelChoiceError("GPT-2 has no grouped-query attention: leave key/value heads empty, or choose "
                                   "a Llama-style family.", field="n_kv_head")
        if shape.n_head % n_kv_head:
            raise ModelChoiceError(f"{n_kv_head} key/value heads do not divide {shape.n_head} heads; each key/value "
                                   "head serves the same number of query heads.", field="n_kv_head")
    return shape


# A custom size's fields as the form bounds them: (smallest, largest, required).
CUSTOM_FIELDS: dict[str, tuple[int, int, bool]] = {
    "n_layer": (1, 256, True), "n_embd": (8, 16_384, True), "n_head": (1, 256, True),
    "n_positions": (8, 65_536, True), "n_kv_head": (1, 256, False), "n_inner": (1, 131_072, False),
}


def model_from_spec(raw: object) -> dict[str, Any]:
    """The stored model choice (as the form makes it) from a pasted spec's ``model`` entry: ``{preset: name}``,
    ``{checkpoint: catalog name}``, or ``{family: ..., n_layer: ..., ...}`` (a custom size). Raises
    ModelChoiceError on ``space_text`` naming what is wrong; the shape itself is checked by `model_shape`."""
    def refuse(message: str) -> ModelChoiceError:
        return ModelChoiceError(f"model: {message}", field="space_text")

    if not isinstance(raw, dict):
        raise refuse("give a mapping: {preset: NAME}, {checkpoint: NAME} or {family: ..., n_layer: ..., ...}.")
    keys = set(raw) - ({"base_dtype"} if "checkpoint" in raw else set())
    chosen = keys & {"preset", "checkpoint"}
    if chosen:
        if len(keys) != 1:
            raise refuse(f"{' and '.join(sorted(quote(str(k)) for k in keys)[:5])} do not go together; give only "
                         "a preset, or only a checkpoint.")
        (key,) = chosen
        name = raw[key]
        if key == "preset":
            if not isinstance(name, str) or name not in PRESETS:
                raise refuse(f"unknown preset {quote(name)}; presets: {', '.join(PRESETS)}.")
            return {"kind": "preset", "preset": name}
        return _checkpoint_by_name(name, refuse) | _base_dtype(raw.get("base_dtype", "fp32"), refuse)
    unknown = sorted(quote(str(k)) for k in keys - {"family", *CUSTOM_FIELDS})
    if unknown:
        raise refuse(f"unknown field(s) {', '.join(unknown[:5])}; a custom size takes family, "
                     f"{', '.join(CUSTOM_FIELDS)}.")
    family = raw.get("family", "gpt2")
    if family not in FAMILIES:
        raise refuse(f"unknown family {quote(family)}; choose one of {', '.join(FAMILIES)}.")
    model: dict[str, Any] = {"kind": "custom", "family": family}
    for name, (low, high, required) in CUSTOM_FIELDS.items():
        value = raw.get(name)
        if value is None:
            if required:
                raise refuse(f"{name} is missing; a custom size needs {', '.join(list(CUSTOM_FIELDS)[:4])}.")
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise refuse(f"{name} is {quote(value)}; give a whole number from {low} to {high:,}.")
        model[name] = value
    return model


def model_to_spec(model: dict[str, Any]) -> dict[str, Any] | None:
    """The ``model`` entry of a pasted spec that `model_from_spec` reads back as `model` (a stored choice), or
    None for a kind pasted text cannot name."""
    kind = model.get("kind")
    if kind == "preset":
        return {"preset": model["preset"]}
    if kind == "checkpoint":
        return {"checkpoint": model["checkpoint_name"]} | _base_dtype(model.get("base_dtype", "fp32"))
    if kind == "custom":
        return {"family": model["family"], **{name: model[name] for name in CUSTOM_FIELDS if name in model}}
    return None


def _base_dtype(value: object, refuse: Any = None) -> dict[str, Any]:
    """A checkpoint's stored ``base_dtype`` entry: none for fp32 (the default), so that choices made before it
    existed stay as they were."""
    if value not in BASE_DTYPES:
        error = f"base_dtype is {quote(value)}; choose one of {', '.join(BASE_DTYPES)}."
        raise refuse(error) if refuse else ModelChoiceError(error, field="base_dtype")
    return {} if value == "fp32" else {"base_dtype": value}


def _checkpoint_by_name(name: object, refuse: Any) -> dict[str, Any]:
    checkpoint = ready_checkpoints().filter(name=name).first() if isinstance(name, str) else None
    if checkpoint is None:
        raise refuse(f"no ready checkpoint named {quote(name)} in the catalog.")
    return {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name}


def model_shape(model: dict[str, Any], *, models_root: Path) -> ModelShape:
    """The base shape of an experiment's model choice (its stored ``model`` JSON)."""
    kind = model.get("kind")
    if kind in ("preset", "custom") and model.get("base_dtype", "fp32") != "fp32":
        raise ModelChoiceError(BASE_DTYPE_NEEDS_A_CHECKPOINT, field="base_dtype")
    if kind == "preset":
        if model.get("preset") not in PRESETS:
            raise ModelChoiceError(f"Unknown preset {model.get('preset')!r}.", field="preset")
        return PRESETS[model["preset"]][1]
    if kind == "custom":
        return _custom_shape(model)
    if kind in ("checkpoint", "pretrained"):
        base_dtype = _base_dtype(model.get("base_dtype", "fp32")).get("base_dtype", "fp32")
        if kind == "checkpoint":
            return replace(checkpoint_shape(model.get("checkpoint")), base_dtype=base_dtype)
        directory = resolve_pretrained_dir(str(model.get("pretrained_dir", "")), models_root=models_root)
        return replace(pretrained_shape(directory), base_dtype=base_dtype)
    if model.get("base_dtype", "fp32") != "fp32":
        raise ModelChoiceError(BASE_DTYPE_NEEDS_A_CHECKPOINT, field="base_dtype")
    raise ModelChoiceError(f"Unknown model kind {kind!r}.", field="model_kind")
