"""The transfer layer on CPU: background reads keyed by buffer version, synchronous loads, errors, close.
The CUDA path (copy stream, staging buffers, events) is in test_cuda.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import CPU
from worker.engine.errors import SpillStoreError
from worker.engine.transfer import Transfers


def write_floats(path: Path, values: torch.Tensor) -> Path:
    """A spill-store-like raw file of fp32 ``values``."""
    values.to(torch.float32).numpy().tofile(path)
    return path


@pytest.fixture
def transfers() -> Iterator[Transfers]:
    transfers = Transfers(CPU, max_numel=16)
    yield transfers
    transfers.close()


def test_it_returns_a_started_read(transfers: Transfers, tmp_path: Path) -> None:
    values = torch.randn(16)
    transfers.start(("p0", 3), write_floats(tmp_path / "p0@3.bin", values), 16)
    taken = transfers.take(("p0", 3))
    assert taken is not None and taken.device == CPU
    assert torch.equal(taken, values)
    assert transfers.take(("p0", 3)) is None  # taken once


def test_it_ignores_a_second_start_of_the_same_key(transfers: Transfers, tmp_path: Path) -> None:
    first = write_floats(tmp_path / "a.bin", torch.zeros(4))
    transfers.start(("g1", 2), first, 4)
    transfers.start(("g1", 2), write_floats(tmp_path / "b.bin", torch.ones(4)), 4)
    assert transfers.take(("g1", 2)).tolist() == [0, 0, 0, 0]


def test_it_returns_none_for_a_key_never_started(transfers: Transfers) -> None:
    assert transfers.take(("p0", 1)) is None


def test_it_drops_reads_of_stale_versions(transfers: Transfers, tmp_path: Path) -> None:
    transfers.start(("p0", 1), write_floats(tmp_path / "p0@1.bin", torch.zeros(4)), 4)
    transfers.start(("p1", 1), write_floats(tmp_path / "p1@1.bin", torch.ones(4)), 4)
    transfers.start(("g0", 1), write_floats(tmp_path / "g0@1.bin", torch.ones(4)), 4)
    transfers.retain({"p0": 2, "p1": 1})  # p0 was committed again; g0 is gone
    assert transfers.take(("p0", 1)) is None
    assert transfers.take(("g0", 1)) is None
    assert transfers.take(("p1", 1)).tolist() == [1, 1, 1, 1]


def test_it_raises_errors_of_the_background_read_on_take(transfers: Transfers, tmp_path: Path) -> None:
    transfers.start(("p0", 1), tmp_path / "missing.bin", 4)
    transfers.start(("p1", 1), write_floats(tmp_path / "short.bin", torch.ones(3)), 4)
    with pytest.raises(FileNotFoundError):
        transfers.take(("p0", 1))
    with pytest.raises(SpillStoreError, match="shorter than 16 bytes"):
        transfers.take(("p1", 1))


def test_it_loads_a_file_or_a_range_of_it(transfers: Transfers, tmp_path: Path) -> None:
    path = write_floats(tmp_path / "m0@1.bin", torch.arange(10))
    assert transfers.load(path, 10).tolist() == list(range(10))
    assert transfers.load(path, 3, offset=4 * 6).tolist() == [6, 7, 8]
    with pytest.raises(SpillStoreError, match="shorter"):
        transfers.load(path, 3, offset=4 * 8)


def test_close_forgets_reads_and_can_be_repeated(tmp_path: Path) -> None:
    transfers = Transfers(CPU, max_numel=4)
    path = write_floats(tmp_path / "p0@1.bin", torch.ones(4))
    transfers.start(("p0", 1), path, 4)
    transfers.close()
    transfers.close()
    assert transfers.take(("p0", 1)) is None
    with pytest.raises(RuntimeError):
        transfers.start(("p0", 1), path, 4)
    assert transfers.load(path, 4).tolist() == [1, 1, 1, 1]
