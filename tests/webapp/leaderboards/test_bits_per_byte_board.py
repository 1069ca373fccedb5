"""The cross-team board ranks by the final evaluation's bits per byte, across tokenizers of the same corpus.

Two teams upload the same corpus with different vocabularies; a trial of each is trained by the engine on its
team's token ids and held-out set (as the launch names them), its final evaluation goes through the
scheduler's telemetry stream and the ingest, and the board ranks the two by bits per byte.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.engine.conftest import CPU
from tests.plain_pytorch import one_thread
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment
from webapp.datasets.models import Dataset
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.trial_data import heldout_data
from webapp.ground.models import Trial
from webapp.leaderboards.selectors import METRICS, cross_team_board, measured_on
from worker.engine import DataSpec, ModelSpec, TrialSpec
from worker.engine.session import UnitResult
from worker.engine.train import train_trial
from worker.scheduling import telemetry, unit_records

pytestmark = pytest.mark.django_db


@pytest.fixture
def host_id(redis_client: redis.Redis) -> Iterator[str]:
    host = f"test-bpb-{uuid.uuid4().hex[:10]}"
    yield host
    keys = list(redis_client.scan_iter(match=f"hydra:{host}:*", count=1000))
    if keys:
        redis_client.delete(*keys)


def final_evaluation(dataset: Dataset, root: Path, *, steps: int) -> UnitResult:
    """Train a small model on the dataset's own ids and held-out set; its final evaluation's result."""
    data = DataSpec(tokens_path=str(dataset.tokens_path), seq_len=8,
                    **heldout_data(dataset=dataset, token_set=None, holdout_bytes=None))
    spec = TrialSpec(model=ModelSpec(n_layer=1, n_embd=16, n_head=2, vocab_size=dataset.vocab_size, n_positions=8),
                     data=data, batch_size=4, steps=steps, eval_every=0)
    with one_thread():
        results = train_trial(spec=spec, spill_dir=root, trial_id="t", device=CPU)
    assert results[-1].final_step == steps
    return results[-1]


def report(client: redis.Redis, host_id: str, trial: Trial, result: UnitResult) -> None:
    """What the scheduler writes for the unit that completed the final evaluation."""
    pipe = client.pipeline()
    for evaluation in unit_records.unit_done(trial.queue_id, result, 0).evals:
        telemetry.add(pipe, host_id, "evals", evaluation)
    pipe.execute()


def test_two_tokenizers_of_one_corpus_rank_by_final_bits_per_byte(alice_team, bob_team, redis_client, host_id,
                                                                   tmp_path):
    alice_data = make_dataset(alice_team, name="alice corpus", vocab_size=300)
    bob_data = make_dataset(bob_team, name="bob corpus", vocab_size=400)
    assert alice_data.vocab_size != bob_data.vocab_size and alice_data.n_tokens != bob_data.n_tokens
    assert (alice_data.corpus_sha256, alice_data.val_offset) == (bob_data.corpus_sha256, bob_data.val_offset)
    assert alice_data.fingerprint != bob_data.fingerprint  # matched by corpus and split, not by vocabulary

    outcomes, trials = {}, {}
    for team, data, steps in ((alice_team, alice_data, 1), (bob_team, bob_data, 6)):
        trial = make_experiment(team, data, name=f"{team.name} sweep").trials.order_by("number")[0]
        Trial.objects.filter(pk=trial.pk).update(queue_id=str(trial.pk), attempt=1, status="finished")
        trial.refresh_from_db()
        result = final_evaluation(data, tmp_path / team.name, steps=steps)
        report(redis_client, host_id, trial, result)
        outcomes[team.name], trials[team.name] = result, trial.pk
    telemetry_ingest(host_id=host_id)

    rows = cross_team_board(dataset=alice_data, metric=METRICS["bpb"])
    expected = sorted(outcomes, key=lambda name: outcomes[name].eval_bpb)
    assert [r["team"] for r in rows] == expected
    assert [r["value"] for r in rows] == [outcomes[name].eval_bpb for name in expected]
    assert [r["ppl"] for r in rows] == [outcomes[name].eval_ppl for name in expected]
    for name, result in outcomes.items():
        trial = Trial.objects.get(pk=trials[name])
        assert (trial.final_bpb, trial.final_loss, trial.final_step, trial.final_eval_bytes) == (
            result.eval_bpb, result.eval_loss, result.final_step, result.eval_bytes)
        # the held-out text but each block's first token: within the validation text's bytes
        assert 0 < trial.final_eval_bytes < alice_data.val_bytes
    assert measured_on(dataset=alice_data, holdout_bytes=None).startswith(
        f"the last {alice_data.val_bytes} bytes of alice corpus (validation split, corpus sha256 ")
