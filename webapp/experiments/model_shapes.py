"""Which GPT-2 a trial trains: a preset, a custom size, or a pretrained directory under the models root.

Pure apart from reading a pretrained directory's ``config.json`` (never its weights, never torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from webapp.experiments.search_space import quote

MAX_CONFIG_BYTES = 1 << 20

class ModelChoiceError(ValueError):
    """A model that cannot be used; ``field`` names the form field at fault."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A GPT-2's shape. ``vocab_size`` 0 means "the dataset's tokenizer's vocabulary"."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int
    vocab_size: int = 0
    pretrained_dir: str | None = None

    def with_params(self, params: dict[str, Any], *, vocab_size: int) -> ModelShape:
        """The shape of one trial: searched width/depth override the base, the dataset fixes the vocabulary."""
        return replace(
            self,
            n_layer=int(params.get("n_layer") or self.n_layer),
            n_embd=int(params.get("n_embd") or self.n_embd),
            vocab_size=self.vocab_size or vocab_size,
        )


# GPT-2's published sizes (small..xl) and two small ones that train on a CPU in seconds.
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


def pretrained_shape(directory: Path) -> ModelShape:
    """The shape from a ``save_pretrained`` GPT-2 directory's ``config.json`` (read only if under 1 MiB)."""
    try:
        with (directory / "config.json").open("rb") as file:
            text = file.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            raise ModelChoiceError(f"{directory.name}/config.json is over {MAX_CONFIG_BYTES >> 20} MiB; a GPT-2 "
                                   "config is a few hundred bytes.", field="pretrained_dir")
        config = json.loads(text)
        if not isinstance(config, dict):
            raise ModelChoiceError(f"{directory.name}/config.json is not a JSON object.", field="pretrained_dir")
        if config.get("model_type") != "gpt2":
            raise ModelChoiceError(
                f"{directory.name} has model_type {quote(config.get('model_type'))}; Hydra trains GPT-2 models.",
                field="pretrained_dir",
            )
        return ModelShape(
            n_layer=int(config["n_layer"]), n_embd=int(config["n_embd"]), n_head=int(config["n_head"]),
            n_positions=int(config["n_positions"]), vocab_size=int(config["vocab_size"]),
            pretrained_dir=str(directory),
        )
    except ModelChoiceError:
        raise
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as error:
        # RecursionError: JSON nested deeper than the parser goes; OverflowError: int(Infinity).
        detail = str(error)[:120] if not isinstance(error, RecursionError) else "nested too deep"
        raise ModelChoiceError(
            f"{directory.name} has no readable GPT-2 config.json ({detail}).", field="pretrained_dir"
        ) from None


def model_shape(model: dict[str, Any], *, models_root: Path) -> ModelShape:
    """The base shape of an experiment's model choice (its stored ``model`` JSON)."""
    kind = model.get("kind")
    if kind == "preset":
        if model.get("preset") not in PRESETS:
            raise ModelChoiceError(f"Unknown preset {model.get('preset')!r}.", field="preset")
        return PRESETS[model["preset"]][1]
    if kind == "custom":
        shape = ModelShape(n_layer=int(model["n_layer"]), n_embd=int(model["n_embd"]), n_head=int(model["n_head"]),
                           n_positions=int(model["n_positions"]))
        if shape.n_embd % shape.n_head:
            raise ModelChoiceError(
                f"The width {shape.n_embd} does not split into {shape.n_head} heads; make it a multiple.",
                field="n_embd",
            )
        return shape
    if kind == "pretrained":
        return pretrained_shape(resolve_pretrained_dir(str(model.get("pretrained_dir", "")), models_root=models_root))
    raise ModelChoiceError(f"Unknown model kind {kind!r}.", field="model_kind")
