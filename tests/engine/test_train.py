"""The single-process loop and the command line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.conftest import CPU, tiny_spec
from worker.engine import ModelSpec, SpecError, TrialSession
from worker.engine.train import parse_bytes, train_trial


def test_it_gives_the_same_numbers_with_and_without_the_double_buffer(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, steps=4, eval_every=2)
    runs = {}
    for double_buffer in (True, False):
        results = train_trial(spec=spec, spill_dir=tmp_path, trial_id=str(double_buffer), device=CPU,
                              cuts=[0, 2, 4], double_buffer=double_buffer)
        runs[double_buffer] = [(r.loss, r.eval_loss, r.bytes_read) for r in results]
    assert runs[True] == runs[False]


def test_it_resumes_an_existing_trial_instead_of_restarting(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, steps=2, eval_every=0)
    first = train_trial(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=[0])
    assert [r.unit.phase for r in first] == ["FB", "FB", "S", "FB", "FB", "S"]  # one shard: each step its S unit
    assert train_trial(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU) == []
    with pytest.raises(SpecError, match="created with another spec"):
        train_trial(spec=tiny_spec(tokens_path, steps=3), spill_dir=tmp_path, trial_id="t", device=CPU)


def test_it_rejects_sequences_longer_than_the_context(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, model=ModelSpec(n_positions=16))
    with pytest.raises(SpecError, match="seq_len 32 exceeds the model's context of 16"):
        train_trial(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU)


def test_it_parses_byte_sizes() -> None:
    assert parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5G") == 3 << 29
    assert parse_bytes("1000") == 1000


def test_the_command_line_trains_from_a_corpus_and_prints_json_last(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus about shards, spills and units. " * 300)
    command = [
        sys.executable, "-m", "worker.engine.train", "--corpus", str(corpus), "--vocab-size", "300",
        "--seq-len", "16", "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--batch-size", "4",
        "--steps", "3", "--eval-every", "3", "--eval-batches", "1", "--budget", "1M",
        "--spill-dir", str(tmp_path / "spill"), "--export", str(tmp_path / "out"), "--no-progress",
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=300,
                            check=True)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["shards"] >= 2
    assert summary["eval_loss"] > 0 and summary["planned_peak_bytes"] <= 1 << 20
    assert (tmp_path / "out" / "config.json").exists()


def test_the_command_line_reports_a_budget_error_without_a_traceback(tokens_path: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "worker.engine.train", "--tokens", str(tokens_path), "--vocab-size", "256",
               "--seq-len", "32", "--budget", "10K", "--spill-dir", str(tmp_path), "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: layer 'embedding' needs") and "Traceback" not in result.stderr


def test_it_stops_early_after_patience_evaluations_without_a_better_loss(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, steps=12, eval_every=1, optimizer=tiny_spec(tokens_path).optimizer)
    full = [r.eval_loss for r in train_trial(spec=spec, spill_dir=tmp_path, trial_id="full", device=CPU)
            if r.eval_loss is not None]
    patience = 2
    best, since, stop = float("inf"), 0, None  # where the rule must stop on this run's own losses
    for step, loss in enumerate(full):
        best, since = (loss, 0) if loss < best else (best, since + 1)
        if since >= patience:
            stop = step
            break
    assert stop is not None and stop < spec.steps - 1, full  # this data does stop early

    early = dataclasses.replace(spec, early_stop_patience=patience)
    results = train_trial(spec=early, spill_dir=tmp_path, trial_id="early", device=CPU)
    assert [r.eval_loss for r in results if r.eval_loss is not None] == full[: stop + 1]
    assert [r.stopped_early for r in results].count(True) == 1 and results[-1].stopped_early
    assert max(r.unit.step for r in results) == stop
    session = TrialSession.open(spill_dir=tmp_path, trial_id="early", device=CPU)
    assert session.next_unit() is None and session.remaining_units() == 0
    session.export(tmp_path / "export")
    assert (tmp_path / "export" / "config.json").is_file()


def test_early_stopping_needs_evaluations(tokens_path: Path) -> None:
    with pytest.raises(SpecError, match="early_stop_patience"):
        tiny_spec(tokens_path, eval_every=0, early_stop_patience=2)
    with pytest.raises(SpecError, match="early_stop_patience"):
        tiny_spec(tokens_path, early_stop_patience=0)
