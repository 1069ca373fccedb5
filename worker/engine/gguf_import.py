"""A GGUF model file as a checkpoint the engine trains from: dequantized fp32 weights in safetensors.

transformers reads a GGUF file (``gguf_file=``) dequantizing every tensor, but its ``save_pretrained`` refuses
a model it loaded from GGUF, so the state dict is written here with safetensors (tied weights once, as
transformers writes them; it re-ties them on load), the config without its ``quantization_config``, and the
tokenizer transformers builds from the GGUF metadata. Everything is written into a temporary sibling of the
output directory, checked with :func:`check_checkpoint`, and renamed into place last: a failure at any point
leaves no output directory, half-written or otherwise.

Before the ``gguf`` package parses a file (it trusts the counts and lengths the file claims: a crafted array
length makes it loop, appending, without end), :func:`check_gguf` walks its header, metadata and tensor
infos, checking each count and length against the bytes the file has left and each tensor's data against its
end. Every step consumes at least one byte or fails, so the walk is bounded by the file's size, whatever it
claims, and reads through a memory map, allocating nothing in proportion to a claimed count.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import mmap
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from safetensors.torch import save_file

from worker.engine.checkpoints import CheckpointError, CheckpointInfo, check_checkpoint
from worker.engine.errors import GgufFormatError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what the gguf package reads; both count tensors and metadata in uint64
SHARD_BYTES = 2 << 30  # weights per safetensors file; bigger models get an indexed set
HEADER_BYTES = 4 + 4 + 8 + 8  # magic, version, tensor count, metadata count
SCALAR_BYTES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
                GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
                GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
KV_MIN_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
TENSOR_INFO_MIN_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset
MIN_ELEMENT_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 4 + 8, **SCALAR_BYTES}
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 4  # GGUF files hold flat arrays; deeper nesting would only exhaust the parser's stack
DEFAULT_ALIGNMENT = 32


def _read_magic(path: Path) -> None:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err}") from err
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


class _Reader:
    """A cursor over a GGUF file's bytes that refuses to step past their end."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.offset, self.size = data, path, 0, len(data)

    def fail(self, problem: str) -> GgufFormatError:
        return GgufFormatError(f"{self.path} could not be loaded as a GGUF model: {problem}")

    @property
    def left(self) -> int:
        return self.size - self.offset

    def skip(self, n: int, what: str) -> int:
        """Step over ``n`` bytes of ``what``; the offset they start at."""
        if n > self.left:
            raise self.fail(f"{what} at byte {self.offset:,} needs {n:,} bytes, past the end of the file "
                            f"({self.size:,} bytes)")
        start, self.offset = self.offset, self.offset + n
        return start

    def u32(self, what: str) -> int:
        return int(struct.unpack_from("<I", self.data, self.skip(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack_from("<Q", self.data, self.skip(8, what))[0])

    def string(self, what: str) -> bytes:
        length = self.u64(f"the length of {what}")
        return bytes(self.data[self.skip(length, what):self.offset])

    def count(self, n: int, each_bytes: int, what: str) -> int:
        """``n``, a claimed number of items of at least ``each_bytes`` each, when the bytes left can hold them."""
        if n * each_bytes > self.left:
            raise self.fail(f"it claims {n:,} {what} at byte {self.offset:,}, but its {self.left:,} bytes left "
                            f"hold at most {self.left // each_bytes:,}")
        return n

    def value(self, raw_type: int, what: str, nesting: int = 0) -> None:
        """Step over a metadata value of type ``raw_type``."""
        try:
            kind = GGUFValueType(raw_type)
        except ValueError:
            raise self.fail(f"{what} has an unknown value type {raw_type}") from None
        if kind in SCALAR_BYTES:
            self.skip(SCALAR_BYTES[kind], what)
        elif kind == GGUFValueType.STRING:
            self.string(what)
        else:
            item_type = self.u32(f"the element type of {what}")
            if item_type not in MIN_ELEMENT_BYTES:
                raise self.fail(f"{what} is an array of an unknown value type {item_type}")
            item = GGUFValueType(item_type)
            n = self.count(self.u64(f"the length of {what}"), MIN_ELEMENT_BYTES[item], f"elements in {what}")
            if item in SCALAR_BYTES:
                self.skip(n * SCALAR_BYTES[item], what)
            elif item == GGUFValueType.ARRAY and nesting >= MAX_ARRAY_NESTING:
                raise self.fail(f"{what} nests arrays deeper than {MAX_ARRAY_NESTING}")
            else:
                for _ in range(n):
                    self.value(item_type, what, nesting + 1)


def check_gguf(path: Path) -> None:
    """Check that ``path`` is a GGUF file whose header, metadata and tensor infos are consistent with its size.

    Raises :class:`CheckpointError` for a file that cannot be read or is not GGUF, :class:`GgufFormatError`
    naming the first count, length or offset that points past the file's end (a truncated file included).
    """
    _read_magic(path)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _walk(_Reader(data, path))


def _walk(reader: _Reader) -> None:
    reader.skip(4, "the magic")
    version = reader.u32("the version")
    if version not in GGUF_VERSIONS:
        raise reader.fail(f"its version is {version}; versions {' and '.join(map(str, GGUF_VERSIONS))} are read")
    n_tensors = reader.u64("the tensor count")
    n_kv = reader.u64("the metadata count")
    reader.count(n_tensors, TENSOR_INFO_MIN_BYTES, "tensors")
    reader.count(n_kv, KV_MIN_BYTES, "metadata entries")
    alignment = DEFAULT_ALIGNMENT
    for index in range(n_kv):
        key = reader.string(f"the key of metadata entry {index}").decode("utf-8", "replace")
        raw_type = reader.u32(f"the value type of {key!r}")
        start = reader.offset
        reader.value(raw_type, f"the value of {key!r}")
        if key == "general.alignment" and raw_type == GGUFValueType.UINT32:
            alignment = int(struct.unpack_from("<I", reader.data, start)[0])
            if alignment == 0 or alignment & (alignment - 1):
                raise reader.fail(f"its alignment {alignment} is not a power of two")
    tensors = [_tensor_info(reader, index) for index in range(n_tensors)]
    data_start = -(-reader.offset // alignment) * alignment
    for name, offset, n_bytes in tensors:
        end = data_start + offset + n_bytes
        if end > reader.size:
            raise reader.fail(f"tensor {name!r}'s data ({n_bytes:,} bytes at byte {data_start + offset:,}) runs "
                              f"past the end of the file ({reader.size:,} bytes)")


def _tensor_info(reader: _Reader, index: int) -> tuple[str, int, int]:
    """Tensor ``index``'s name, data offset (from the data section's start) and size in bytes."""
    name = reader.string(f"the name of tensor {index}").decode("utf-8", "replace")
    n_dims = reader.u32(f"the dimension count of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise reader.fail(f"tensor {name!r} has {n_dims:,} dimensions; GGUF tensors have at most {MAX_DIMS}")
    n_elements = 1
    for _ in range(n_dims):
        n_elements *= reader.u64(f"a dimension of tensor {name!r}")
    raw_type = reader.u32(f"the type of tensor {name!r}")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
    except (ValueError, KeyError):
        raise reader.fail(f"tensor {name!r} has an unknown type {raw_type}") from None
    offset = reader.u64(f"the data offset of tensor {name!r}")
    return name, offset, n_elements * block_bytes // block


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


_PARSE_ONCE = threading.Lock()  # one import patches the gguf package at a time


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Within an import, one parse of each GGUF file and one tensor-name map per architecture and depth.

    transformers reads the file three times (the config, the weights, the tokenizer), each time parsing every
    metadata field again (SmolLM2's vocabulary alone is 49,152 strings and its merges as many), and builds
    gguf's tensor-name map once per module of the model. Both are pure functions of their arguments, and
    transformers looks both up in the gguf package when it calls them, so for the import's duration the
    package answers them from a cache. Nothing else changes: the weights, config and tokenizer written are
    the same bytes (tests/engine/test_gguf_import_cache.py)."""
    import gguf

    with _PARSE_ONCE:
        reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], object] = {}

        def reader(path: str | os.PathLike[str], mode: str = "r") -> object:
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
            readers.clear()


def import_gguf(gguf_path: Path | str, out_dir: Path | str, *,
                progress: Callable[[str], None] | None = None) -> CheckpointInfo:
    """Convert the GGUF model ``gguf_path`` into the checkpoint directory ``out_dir`` (which must not exist).

    Returns the checked checkpoint's :class:`CheckpointInfo`. Raises :class:`CheckpointError` for a file that
    is not GGUF or that transformers cannot load (:class:`GgufFormatError` for one :func:`check_gguf` refuses),
    and for an ``out_dir`` that already exists.
    """
    say = progress or (lambda message: None)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir).absolute()
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path} does not exist or is not a file")
    _read_magic(gguf_path)
    if out_dir.exists():
        raise CheckpointError(f"{out_dir} already exists; import into a new directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.importing-", dir=out_dir.parent))
    try:
        check_gguf(gguf_path)
        say(f"reading {gguf_path.name} (dequantizing to float32)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            with _parsed_once():
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
        info = check_checkpoint(staging.resolve())
        _readable_as_umask_allows(staging)
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"imported into {out_dir}")
    return info
