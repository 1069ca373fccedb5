"""One read-only copy per host of a pretrained model's frozen weights, shared by every LoRA trial on it.

A LoRA trial trains only its adapters; the base weights never change, so the host keeps them once, beside
the trials' spill stores, under ``spill_dir/.bases/<key>/``, where ``key`` is a digest of the checkpoint's
*content* (its config and weight files), not of its path, and of the precision the base is stored in
(``ModelSpec.base_dtype``; an fp32 base's key is the content digest alone) with the version of that precision's
layout (:data:`LAYOUTS`): the same checkpoint copied elsewhere is the same base, a checkpoint replaced in place
is another one, and so is the same checkpoint in nf4 beside it in bf16, or in nf4 at another layout.

    <key>/layer-<i>.safetensors   the frozen weights layer i registers first (a tied weight once), at the
                                  base's precision (worker.engine.base_formats: a quantized matrix is a few
                                  named parts), quantized once, here, from the checkpoint's weights
    <key>/index.json              checkpoint name -> layer file, shape and precision (an nf4 base's token
                                  embedding and head are int8), the base's precision and its bytes
    <key>/refs/<trial id>         one empty file per trial using the base

A trial adds its reference when it is created and removes it when it ends (exported, failed, cancelled or
deleted); the last one out deletes the base. References are files, so a process killed between the two
leaves a state the next call completes. Everything that adds, removes or builds runs under an exclusive
``flock`` on ``<key>.lock``, so two trials planned at once build the base once.

Reads go through a per-process cache (:class:`BaseCache`) that keeps the frozen layers of the last shard a
device loaded: a device running units of two trials on the same base shard back to back reads it once, and
the background read of a coming unit's shard skips the layers the device holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from worker.engine.base_formats import dequantize, part_names, quantize

# The layout's names and its torch-free readers, re-exported: the web process reads them from base_index.
from worker.engine.base_index import BASES, INDEX, REFS
from worker.engine.base_index import base_bytes as base_bytes
from worker.engine.base_index import bases as bases
from worker.engine.checkpoint_files import checkpoint_dir
from worker.engine.errors import SpecError
from worker.engine.layers import LayerStack
from worker.engine.sizes import stored_bytes
from worker.engine.weights import PretrainedWeights

_DIGEST_CHUNK = 16 << 20
# The version of a precision's layout (which tensors it stores how), part of its bases' keys: a host's base
# written at another version is another base. nf4: 2 keeps the token embedding and the head in int8.
LAYOUTS = {"nf4": 2}
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime ns) -> digest: a file is hashed once


def _file_digest(path: Path) -> str:
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_DIGEST_CHUNK):
                digest.update(chunk)
        _digests[memo] = digest.hexdigest()
    return _digests[memo]


def content_key(pretrained_dir: Path, base_dtype: str = "fp32") -> str:
    """The digest that names a checkpoint's shared base at ``base_dtype``: its config and every weight file's
    content, and the precision unless fp32, with its layout's version (:data:`LAYOUTS`). Raises
    ``CheckpointLinkError`` when a symbolic link leads the directory, or a file of it, elsewhere."""
    directory = checkpoint_dir(pretrained_dir)
    files = sorted(p for p in directory.iterdir() if p.name == "config.json" or p.suffix == ".safetensors")
    if not any(p.suffix == ".safetensors" for p in files):
        raise SpecError(f"{directory} has no safetensors weights to share")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{_file_digest(path)}\n".encode())
    if base_dtype != "fp32":
        digest.update(f"base_dtype:{base_dtype}\n".encode())
    if base_dtype in LAYOUTS:
        digest.update(f"layout:{LAYOUTS[base_dtype]}\n".encode())
    return digest.hexdigest()[:32]


def base_root(spill_dir: Path, key: str) -> Path:
    return Path(spill_dir) / BASES / key


@contextlib.contextmanager
def _locked(spill_dir: Path, key: str) -> Iterator[None]:
    bases = Path(spill_dir) / BASES
    bases.mkdir(parents=True, exist_ok=True)
    with open(bases / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def acquire(*, spill_dir: Path, stack: LayerStack, pretrained_dir: Path, trial_id: str,
            base_dtype: str = "fp32") -> str:
    """Make sure this host holds the frozen base of ``stack`` at ``base_dtype`` (built, and quantized, from
    ``pretrained_dir`` if absent) and count ``trial_id`` as one of its users; return the base's key."""
    key = content_key(pretrained_dir, base_dtype)
    root = base_root(spill_dir, key)
    with _locked(spill_dir, key):
        if not (root / INDEX).exists():
            _build(root, stack, PretrainedWeights(Path(pretrained_dir)), base_dtype)
        (root / REFS).mkdir(exist_ok=True)
        (root / REFS / trial_id).touch()
    return key


def release(*, spill_dir: Path, key: str, trial_id: str) -> bool:
    """``trial_id`` no longer uses base ``key``; delete the base if no trial does. Returns whether it was
    deleted. Idempotent: releasing twice, or a base already gone, does nothing."""
    root = base_root(spill_dir, key)
    if not root.exists():
        return False
    with _locked(spill_dir, key):
        (root / REFS / trial_id).unlink(missing_ok=True)
        if (root / REFS).is_dir() and any((root / REFS).iterdir()):
            return False
        shutil.rmtree(root, ignore_errors=True)
    BaseCache.forget(root)
    return True


def release_trial(*, spill_dir: Path, trial_id: str) -> None:
    """``trial_id`` ended or was deleted: release every base of this host it used (none without LoRA)."""
    directory = Path(spill_dir) / BASES
    if directory.is_dir():
        for root in directory.iterdir():
            if (root / REFS / trial_id).exists():
                release(spill_dir=spill_dir, key=root.name, trial_id=trial_id)


def reacquire(*, spill_dir: Path, stack: LayerStack, pretrained_dir: Path, trial_id: str, key: str,
              base_dtype: str = "fp32") -> None:
    """Bring back base ``key`` for a trial whose store outlived it (restored from a checkpoint after the
    host's memory tier was wiped); ``SpecError`` if the checkpoint's content is no longer that base."""
    if (base_root(spill_dir, key) / INDEX).exists() and (base_root(spill_dir, key) / REFS / trial_id).exists():
        return
    found = acquire(spill_dir=spill_dir, stack=stack, pretrained_dir=pretrained_dir, trial_id=trial_id,
                    base_dtype=base_dtype)
    if found != key:
        release(spill_dir=spill_dir, key=found, trial_id=trial_id)
        layout = f", or the {base_dtype} base's layout has" if base_dtype in LAYOUTS else ""
        raise SpecError(f"trial {trial_id} was trained on a base whose checkpoint {pretrained_dir} has changed "
                        f"since{layout}; its adapters belong to the old weights")


def _build(root: Path, stack: LayerStack, source: PretrainedWeights, base_dtype: str) -> None:
    """Write the base at ``base_dtype`` into a new directory beside ``root`` and rename it into place (all or
    nothing)."""
    staging = root.with_name(f".{root.name}.building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    where: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    formats: dict[str, str] = {}
    total = 0
    for index in range(len(stack)):
        tensors: dict[str, torch.Tensor] = {}
        for ref in stack.frozen[index]:
            if ref.key in where or ref.key in tensors:
                continue
            tensor = source.get(ref.key)
            if tuple(tensor.shape) != ref.shape:
                raise SpecError(f"{ref.key} has shape {tuple(tensor.shape)}, the config says {ref.shape}")
            formats[ref.key] = ref.stored_as(base_dtype)
            tensors |= quantize(tensor, formats[ref.key], ref.key)
            shapes[ref.key] = ref.shape
            total += stored_bytes(ref.shape, base_dtype, vocabulary=ref.vocabulary)
        filename = f"layer-{index}.safetensors"
        save_file(tensors, staging / filename, metadata={"format": "pt"})
        where |= {ref.key: filename for ref in stack.frozen[index] if ref.key in tensors}
    (staging / INDEX).write_text(json.dumps({"files": where, "bytes": total, "dtype": base_dtype,
                                               "shapes": shapes, "formats": formats}))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(staging, root)


def read_dequantized(root: Path, filename: str) -> dict[str, torch.Tensor]:
    """The frozen weights of one of base ``root``'s layer files, by checkpoint name, dequantized to fp32 on the
    CPU (what a LoRA trial's forward computed with: its export merges the adapters into these)."""
    index = json.loads((root / INDEX).read_text())
    with safe_open(root / filename, framework="pt", device="cpu") as f:
        parts = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    if str(index.get("dtype", "fp32")) == "fp32":
        return parts
    formats = _formats(index)
    return {key: dequantize(parts, key, tuple(index["shapes"][key]), formats[key])
            for key, name in index["files"].items() if name == filename}


def _formats(index: dict[str, Any]) -> dict[str, str]:
    """Checkpoint name -> the precision its tensor is stored at, as a base's index records it (an index without
    the entry is of a base storing every matrix at the base's precision, vectors in fp32 for int8 and nf4)."""
    if "formats" in index:
        return {key: str(tensor_dtype) for key, tensor_dtype in index["formats"].items()}
    return dict.fromkeys(index["files"], str(index.get("dtype", "fp32")))


class BaseCache:
    """The frozen base layers a device holds, per process: those of the LoRA unit it runs (or last ran),
    and those being read in the background for the next one.

    ``layers`` returns the tensors of layers ``[first, stop)`` of a base on a device, reading only those it
    does not hold, and lets go of every other held layer, of this base or another, but those a background
    read fetched for the next unit: a device holds one shard's frozen weights while a unit runs, as the
    memory plan counts them, plus the next shard's, which the plan's prefetch reserve covers. A device that
    runs units of two trials on the same base shard back to back reads it once (the scheduler arranges that,
    see ``worker.scheduling.policy``). ``prefetch`` starts reading a coming unit's layers, but for those the
    unit about to run loads, which the coming one then finds held. ``drop`` lets go of a device's held layers:
    a unit of a trial without a base does not budget for them. ``reads`` and ``hits`` count layer loads, for
    the benchmarks and tests.
    """

    _held: dict[str, tuple[str, dict[int, dict[str, torch.Tensor]]]] = {}  # device -> (base root, layers)
    _pending: dict[str, tuple[str, range, Future[dict[int, dict[str, torch.Tensor]]]]] = {}  # device -> read
    # base root -> (checkpoint name -> layer file, checkpoint name -> precision)
    _files: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    _reader: ThreadPoolExecutor | None = None
    reads = 0
    hits = 0

    @classmethod
    def layers(cls, root: Path, stack: LayerStack, first: int, stop: int,
               device: torch.device) -> dict[int, dict[str, torch.Tensor]]:
        wanted, ahead = range(first, stop), range(0)
        held_root, held = cls._held.pop(str(device), (str(root), {}))
        held = {i: t for i, t in held.items() if held_root == str(root)}
        cls.hits += sum(1 for i in wanted if i in held)
        pending = cls._pending.get(str(device))
        if pending is not None and pending[0] == str(root):
            ahead = pending[1]
            if set(ahead) & set(wanted):  # the read was for this unit (or also covers it): take it
                del cls._pending[str(device)]
                with contextlib.suppress(OSError, SpecError, RuntimeError):  # read below again, and raise there
                    held |= {i: t for i, t in pending[2].result().items() if i not in held}
        held = {i: t for i, t in held.items() if i in wanted or i in ahead}
        files, formats = cls._index(root)
        for index in wanted:
            if index not in held:
                held[index] = _read_layer(root, files, stack, index, device, formats)
                cls.reads += 1
        cls._held[str(device)] = (str(root), held)
        return {index: held[index] for index in wanted}

    @classmethod
    def prefetch(cls, root: Path, stack: LayerStack, first: int, stop: int, device: torch.device, *,
                 running: tuple[Path, int, int] | None) -> int:
        """Start reading layers ``[first, stop)`` of a base on ``device`` in the background, but for those of
        ``running`` (the base layers ``(root, first, stop)`` of the unit about to run here, None if it reads
        none): that unit loads them, and the device still holds them after it. Returns how many are read."""
        cls._pending.pop(str(device), None)  # an earlier guess: its read is dropped
        loading = range(running[1], running[2]) if running is not None and running[0] == root else range(0)
        missing = [i for i in range(first, stop) if i not in loading]
        if not missing:
            return 0
        files, formats = cls._index(root)
        if cls._reader is None:
            cls._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydra-base-reader")
        cls._pending[str(device)] = (str(root), range(first, stop), cls._reader.submit(
            lambda: {i: _read_layer(root, files, stack, i, device, formats) for i in missing}))
        cls.reads += len(missing)
        return len(missing)

    @classmethod
    def holding(cls, device: torch.device) -> tuple[str, int, int] | None:
        """The key of the base a device holds layers of and their range ``[first, stop)``, or None."""
        root, held = cls._held.get(str(device), ("", {}))
        return (Path(root).name, min(held), max(held) + 1) if held else None

    @classmethod
    def drop(cls, device: torch.device) -> None:
        cls._held.pop(str(device), None)

    @classmethod
    def formats(cls, root: Path) -> dict[str, str]:
        """Checkpoint name -> the precision base ``root`` stores its tensor at, for dequantizing its parts."""
        return cls._index(root)[1]

    @classmethod
    def _index(cls, root: Path) -> tuple[dict[str, str], dict[str, str]]:
        found = cls._files.get(str(root))
        if found is None:
            index = json.loads((root / INDEX).read_text())
            found = cls._files[str(root)] = (index["files"], _formats(index))
        return found

    @classmethod
    def forget(cls, root: Path) -> None:
        cls._files.pop(str(root), None)
        for device in [d for d, (r, _) in cls._held.items() if r == str(root)]:
            del cls._held[device]
        for device in [d for d, (r, *_) in cls._pending.items() if r == str(root)]:
            del cls._pending[device]

    @classmethod
    def clear(cls) -> None:
        cls._held.clear()
        cls._pending.clear()
        cls._files.clear()


def _read_layer(root: Path, files: dict[str, str], stack: LayerStack, index: int,
                device: torch.device, formats: dict[str, str]) -> dict[str, torch.Tensor]:
    """Layer ``index``'s frozen weights on ``device`` as the base stores them: each weight's parts by name
    (:func:`worker.engine.base_formats.part_names`; an fp32 or bf16 weight is one part, under its key)."""
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for ref in stack.frozen[index]:
        if ref.key not in files:
            raise SpecError(f"the shared base in {root} lacks {ref.key}: it was built for another model")
        by_file.setdefault(files[ref.key], []).extend(part_names(ref.key, ref.shape, formats[ref.key]))
    for filename, names in by_file.items():
        with safe_open(root / filename, framework="pt", device=str(device)) as f:
            for name in dict.fromkeys(names):
                tensors[name] = f.get_tensor(name)
    return tensors
