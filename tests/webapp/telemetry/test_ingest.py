"""telemetry_ingest against a real Redis: batches, cursors, replays, attempts, levels of detail, events."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from tests.engine.conftest import CPU, run_all
from tests.engine.test_dpo import N_PAIRS, dpo_spec, random_pairs
from tests.webapp.telemetry.factories import make_experiment, write_event, write_sample, write_span, write_steps
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Trial
from webapp.health.models import SkippedEntry
from webapp.telemetry import levels
from webapp.telemetry.models import DeviceSample, EvalMetric, StepMetric, StreamCursor, UnitSpan
from worker.contract import SyntheticJob
from worker.engine import TrialSession, trial_create
from worker.engine.pairs import save_pairs
from worker.scheduling import telemetry
from worker.scheduling.queue import ShardQueue
from worker.scheduling.unit_records import unit_done

pytestmark = pytest.mark.django_db


@pytest.fixture
def trials(alice_team) -> list[Trial]:
    experiment = make_experiment(alice_team, trials=[{"lr": 1e-3}, {"lr": 3e-3}], total_steps=300)
    return list(experiment.trials.order_by("number"))


def test_it_stores_every_stream_in_batches_and_advances_the_cursors(redis_client, host_id, trials):
    first, second = trials
    write_steps(redis_client, host_id, first, range(0, 250))
    write_steps(redis_client, host_id, second, range(0, 30))
    write_span(redis_client, host_id, first, device="cpu0", unit=0, start=1.0, end=2.0)
    write_span(redis_client, host_id, second, device="cpu1", unit=0, start=1.5, end=2.5)
    write_sample(redis_client, host_id, device="cpu0", at=1.2, utilization=0.9)

    read = telemetry_ingest(host_id=host_id, batch_size=100)

    assert read == {"steps": 280, "evals": 28, "spans": 2, "samples": 1, "checkpoints": 0, "events": 0}
    assert StepMetric.objects.filter(trial=first).count() == 250
    assert EvalMetric.objects.filter(trial=second).count() == 3
    assert set(UnitSpan.objects.values_list("device", flat=True)) == {"cpu0", "cpu1"}
    assert DeviceSample.objects.get().utilization == 0.9
    cursor = StreamCursor.objects.get(host=host_id, stream="steps").cursor
    assert cursor == redis_client.xrevrange(f"hydra:{host_id}:steps", count=1)[0][0]
    first.refresh_from_db()
    assert first.step == 250  # steps 0..249 done
    assert first.best_val_loss == min(EvalMetric.objects.filter(trial=first).values_list("loss", flat=True))


def test_it_counts_every_step_of_a_finished_trial_as_done(redis_client, host_id, alice_team):
    trial = make_experiment(alice_team, trials=[{"lr": 1e-3}], total_steps=60).trials.get()
    write_steps(redis_client, host_id, trial, range(0, 60))  # the scheduler's step indices are 0-based
    write_event(redis_client, host_id, trial, "finished")

    telemetry_ingest(host_id=host_id)

    trial.refresh_from_db()
    assert (trial.status, trial.step, trial.progress) == ("finished", 60, 1.0)


def test_it_keeps_the_plan_a_device_measured_when_the_trial_becomes_runnable(redis_client, host_id, alice_team):
    trial = make_experiment(alice_team, trials=[{"lr": 1e-3}], status="planning").trials.get()
    estimate = trial.plan
    measured = {"budget_bytes": 8 << 20, "reserve_bytes": 1 << 20, "peak_bytes": 7 << 20, "state_bytes": 2 << 20,
                "shards": [{"index": 0, "layers": ["embedding", "block.0", "block.1", "head"], "param_bytes": 1,
                            "grad_bytes": 1, "optim_bytes": 2, "activation_bytes": 3}]}
    queue = ShardQueue(redis_client, host_id)
    queue.submit(trial_id=trial.queue_id, job=SyntheticJob(units=1), export_dir="")
    job = queue.claim_plan("cpu0")
    queue.plan_done(job, remaining_units=10, unit_s=0.01, plan=measured)  # publishes "planning", "runnable"

    telemetry_ingest(host_id=host_id)

    trial.refresh_from_db()
    assert trial.status == "runnable" and trial.plan != estimate
    assert trial.plan == measured | {"source": "measured"}


def test_it_reads_only_what_is_new(redis_client, host_id, trials):
    write_steps(redis_client, host_id, trials[0], range(0, 10))
    telemetry_ingest(host_id=host_id)
    write_steps(redis_client, host_id, trials[0], range(10, 15))
    assert telemetry_ingest(host_id=host_id)["steps"] == 5
    assert telemetry_ingest(host_id=host_id)["steps"] == 0


def test_it_stores_nothing_twice_when_a_batch_is_replayed(redis_client, host_id, trials):
    write_steps(redis_client, host_id, trials[0], range(0, 40))
    write_span(redis_client, host_id, trials[0], device="cpu0", unit=0, start=1.0, end=2.0)
    telemetry_ingest(host_id=host_id)
    StreamCursor.objects.filter(host=host_id).update(cursor="0-0")  # as if the cursor update had been lost

    telemetry_ingest(host_id=host_id)

    assert StepMetric.objects.count() == 40
    assert EvalMetric.objects.count() == 4
    assert UnitSpan.objects.count() == 1


def test_it_drops_entries_of_unknown_trials_and_of_replaced_attempts(redis_client, host_id, trials):
    trial = trials[0]
    write_steps(redis_client, host_id, trial, range(0, 5))  # attempt 1, queue id "<pk>"
    Trial.objects.filter(pk=trial.pk).update(attempt=2, queue_id=f"{trial.pk}.2", step=0)
    trial.refresh_from_db()
    write_steps(redis_client, host_id, trial, range(0, 3))
    redis_client.xadd(f"hydra:{host_id}:steps", {"trial": "999999", "step": 1, "loss": 1.0, "lr": 0.1,
                                                 "tokens": 1, "time": 1.0})

    telemetry_ingest(host_id=host_id)

    # Stored at the steps done, counted from 1 (the workers number them from 0).
    assert list(StepMetric.objects.values_list("attempt", "step").order_by("step")) == [(2, 1), (2, 2), (2, 3)]


def test_it_keeps_levels_of_detail_equal_to_a_recomputation_from_scratch(redis_client, host_id, trials):
    trial = trials[0]
    # Out of order and in small batches, so buckets are revisited and representatives demoted.
    for chunk in (range(0, 70), range(140, 300), range(70, 140)):
        write_steps(redis_client, host_id, trial, chunk)
        telemetry_ingest(host_id=host_id, batch_size=33)

    rows = list(StepMetric.objects.filter(trial=trial).values_list("id", "step", "loss", "level"))
    expected = {i: 0 for i, _, _, _ in rows}
    candidates = [levels.Point(i, s, loss) for i, s, loss, _ in rows]
    for level in range(1, levels.MAX_LEVEL + 1):
        keep = levels.representatives(candidates, level)
        for i in keep:
            expected[i] = level
        candidates = [p for p in candidates if p.id in keep]
    assert {i: lv for i, _, _, lv in rows} == expected


def test_it_applies_trial_state_events_through_the_status_service(redis_client, host_id, trials):
    first, second = trials
    write_event(redis_client, host_id, first, "finished")
    write_event(redis_client, host_id, second, "failed", "CUDA out of memory twice")
    write_event(redis_client, host_id, first, "running")  # an ended trial is never revived

    telemetry_ingest(host_id=host_id)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == "finished" and first.finished is not None
    assert second.status == "failed" and second.message == "CUDA out of memory twice"


def test_the_command_drains_once(redis_client, host_id, trials, capsys):
    write_steps(redis_client, host_id, trials[0], range(0, 12))
    call_command("hydra_ingest", "--once", "--host", host_id)
    assert StepMetric.objects.count() == 12
    assert f"hydra_ingest {host_id}: steps 12" in capsys.readouterr().out


def test_a_dpo_trials_rewards_go_from_its_units_to_its_metrics(redis_client, host_id, alice_team, tmp_path):
    """A DPO trial's units report rewards beside the loss; the scheduler's records of them, written to the host's
    streams, are stored with the trial's steps and evaluations; a language-modelling trial's stay empty."""
    dpo_trial, lm_trial = make_experiment(alice_team, trials=[{"lr": 1e-3}, {"lr": 3e-3}]).trials.order_by("number")
    save_pairs(random_pairs(N_PAIRS, seed=11), tmp_path / "pairs")
    spec = dpo_spec(tmp_path / "pairs", steps=4, eval_every=2)
    trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU, cuts=[0, 2])
    results = run_all(TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU))
    pipe = redis_client.pipeline()
    for result in results:
        done = unit_done(dpo_trial.queue_id, result, remaining_units=0)
        telemetry.add_all(pipe, host_id, span=telemetry.Span(
            trial=dpo_trial.queue_id, device="cpu0", unit=result.unit.index, step=result.unit.step, micro_batch=0,
            phase=result.unit.phase, shard=result.unit.shard, start=1.0, end=2.0, bytes_moved=0, peak_bytes=0, pid=1),
            steps=done.steps, evals=done.evals)
    pipe.execute()
    write_steps(redis_client, host_id, lm_trial, range(0, 10))

    telemetry_ingest(host_id=host_id)

    steps = [r for r in results if r.loss is not None]
    assert list(StepMetric.objects.filter(trial=dpo_trial).order_by("step").values_list(
        "loss", "rewards_chosen", "rewards_rejected", "reward_accuracy")) == [
        (r.loss, r.rewards_chosen, r.rewards_rejected, r.reward_accuracy) for r in steps]
    evals = [r for r in results if r.eval_loss is not None]
    assert list(EvalMetric.objects.filter(trial=dpo_trial).order_by("step").values_list(
        "loss", "perplexity", "rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy")) == [
        (r.eval_loss, r.eval_ppl, r.eval_rewards_chosen, r.eval_rewards_rejected, r.eval_reward_margin,
         r.eval_reward_accuracy) for r in evals]
    assert len(evals) == 2 and all(0 <= r.eval_reward_accuracy <= 1 for r in evals)
    assert set(StepMetric.objects.filter(trial=lm_trial).values_list("rewards_chosen", "reward_accuracy")) == {
        (None, None)}
    assert set(EvalMetric.objects.filter(trial=lm_trial).values_list("reward_margin", flat=True)) == {None}


def test_an_entry_the_database_refuses_is_skipped_and_the_stream_goes_on(redis_client, host_id, alice_team, bob_team):
    """One team's step with a step number no column holds stops neither its other steps nor another team's."""
    alices = make_experiment(alice_team, trials=[{"lr": 1e-3}]).trials.get()
    bobs = make_experiment(bob_team, trials=[{"lr": 1e-3}]).trials.get()
    write_steps(redis_client, host_id, alices, range(0, 3))
    pipe = redis_client.pipeline()
    telemetry.add(pipe, host_id, "steps", telemetry.StepMetrics(trial=alices.queue_id, step=2**64, loss=1.0, lr=1e-3,
                                                                tokens=1, time=1.0))
    pipe.execute()
    poisoned = redis_client.xrevrange(f"hydra:{host_id}:steps", count=1)[0][0]
    write_steps(redis_client, host_id, bobs, range(0, 4))

    assert telemetry_ingest(host_id=host_id)["steps"] == 8

    assert list(StepMetric.objects.filter(trial=alices).values_list("step", flat=True).order_by("step")) == [1, 2, 3]
    assert StepMetric.objects.filter(trial=bobs).count() == 4
    skipped = SkippedEntry.objects.get()
    assert (skipped.stream, skipped.entry_id, skipped.trial) == ("steps", poisoned, alices.queue_id)
    assert telemetry_ingest(host_id=host_id)["steps"] == 0  # the cursor moved past it
