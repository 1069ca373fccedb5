"""A GGUF model file as a checkpoint the engine trains from: dequantized fp32 weights in safetensors.

transformers reads a GGUF file (``gguf_file=``) dequantizing every tensor, but its ``save_pretrained`` refuses
a model it loaded from GGUF, so the state dict is written here with safetensors (tied weights once, as
transformers writes them; it re-ties them on load), the config without its ``quantization_config``, and the
tokenizer transformers builds from the GGUF metadata. Everything is written into a temporary sibling of the
output directory, checked with :func:`check_checkpoint`, and renamed into place last: a failure at any point
leaves no output directory, half-written or otherwise.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from worker.engine.checkpoints import CheckpointError, CheckpointInfo, check_checkpoint

GGUF_MAGIC = b"GGUF"
SHARD_BYTES = 2 << 30  # weights per safetensors file; bigger models get an indexed set


def _check_gguf(path: Path) -> None:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err}") from err
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


def _unique_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared storage once, under its first name (the tied LM head is dropped)."""
    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to(torch.float32).contiguous()
    return tensors


def _write_weights(tensors: dict[str, torch.Tensor], out_dir: Path) -> None:
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    if len(groups) == 1:
        save_file(groups[0], out_dir / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for number, group in enumerate(groups, start=1):
        filename = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, out_dir / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, filename))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _write_config(model: torch.nn.Module, out_dir: Path) -> None:
    """The model's config as ``save_pretrained`` writes it, less the GGUF quantization it no longer has."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.name_or_path = ""
    config.save_pretrained(out_dir)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out_dir)


def _readable_as_umask_allows(directory: Path) -> None:
    """Give the directory (``mkdtemp`` makes it private) and its files the modes a plain ``mkdir`` would."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def import_gguf(gguf_path: Path | str, out_dir: Path | str, *,
                progress: Callable[[str], None] | None = None) -> CheckpointInfo:
    """Convert the GGUF model ``gguf_path`` into the checkpoint directory ``out_dir`` (which must not exist).

    Returns the checked checkpoint's :class:`CheckpointInfo`. Raises :class:`CheckpointError` for a file that
    is not GGUF or that transformers cannot load, and for an ``out_dir`` that already exists.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = progress or (lambda message: None)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path} does not exist or is not a file")
    _check_gguf(gguf_path)
    if out_dir.exists():
        raise CheckpointError(f"{out_dir} already exists; import into a new directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.importing-", dir=out_dir.parent))
    try:
        say(f"reading {gguf_path.name} (dequantizing to float32)")
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                         dtype=torch.float32, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      local_files_only=True)
        except Exception as err:  # a malformed file fails deep inside gguf or transformers, with any error type
            raise CheckpointError(f"{gguf_path} could not be loaded as a GGUF model: {err}") from err
        say("writing the weights as safetensors")
        _write_weights(_unique_tensors(model), staging)
        _write_config(model, staging)
        del model
        tokenizer.save_pretrained(staging)
        say("checking the checkpoint")
        info = check_checkpoint(staging)
        _readable_as_umask_allows(staging)
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"imported into {out_dir}")
    return info
