"""The key map (worker/scheduling/keys.py) is the keys a host's queue, telemetry and API keep: every key they
write is in it with its type and fields, every entry is written, and the docs show the same table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import redis

from tests.worker.queue_helpers import SPEC, runnable, survey
from tests.worker.test_queue_wavefront import FOUR
from worker import api, config
from worker.contract import EngineJob
from worker.scheduling import keys, telemetry
from worker.scheduling.policy import BaseShard
from worker.scheduling.queue import ShardQueue

ROOT = Path(__file__).resolve().parents[2]
QUEUE = ROOT / "worker" / "scheduling" / "queue"


class Seen:
    """The key map's entries seen among a host's keys; each key checked against its entry as it is seen."""

    def __init__(self, client: redis.Redis, host_id: str) -> None:
        self.client, self.prefix = client, keys.host_prefix(host_id)
        self.patterns: set[str] = set()

    def look(self) -> None:
        for name in self.client.scan_iter(match=self.prefix + "*", count=1000):
            key = keys.host_key(name.removeprefix(self.prefix))
            assert key is not None, f"{name} is in no entry of keys.HOST_KEYS"
            assert self.client.type(name) == key.type, name
            if key.fields:
                assert set(self.client.hkeys(name)) <= set(key.fields), name
            self.patterns.add(key.pattern)


def test_every_key_a_host_keeps_is_in_the_key_map_and_every_entry_is_kept(
    redis_client: redis.Redis, redis_url: str, host_id: str
) -> None:
    queue = ShardQueue(redis_client, host_id)
    seen = Seen(redis_client, host_id)
    queue.configure(lease_s=60.0, usage_half_life_s=3600.0, capacity_bytes=10**9)
    queue.set_capacity_override(10**9)
    queue.set_weights({"alpha": 2.0})
    queue.set_quotas({"alpha": 2}, {"alpha": 10**6})
    for trial_id in ("a1", "a2", "a3"):
        queue.submit(trial_id=trial_id, job=SPEC, export_dir="", team="alpha", host_bytes=100)
    for _ in range(2):
        job = queue.claim_plan("cpu0")
        queue.plan_done(job, remaining_units=3, unit_s=0.5, plan={})
    assert queue.claim_plan("cpu0") is None  # a3 waits for alpha's quota: the scan is blocked
    seen.look()
    runnable(queue, "b1", units=3)
    runnable(queue, "b2", units=4)
    queue.device_start("cpu1", "epoch-1")
    queue.complete(queue.claim("a1", "cpu1"), remaining_units=2, unit_s=0.5, hold_s=60.0,
                   next_base=BaseShard("base", 0, 4))
    queue.cancel("b1")
    seen.look()  # before a survey hands b1 to its device to reap
    survey(queue)
    # b2, claimed speculatively, keeps its undo_* fields
    queue.complete_then_survey(queue.claim("a2", "cpu0"), "epoch-1", remaining_units=2, unit_s=0.5, claim=["b2"])
    queue.submit(trial_id="p1", job=SPEC, export_dir="")
    queue.claim_plan("cpu1")
    # w1's micro-batches may run at once: with lane 0 in flight and lane 1 ready, it waits to widen
    queue.submit(trial_id="w1", job=EngineJob(trial=FOUR), export_dir="", team="beta")
    queue.plan_done(queue.claim_plan("cpu1"), remaining_units=9, unit_s=0.5, plan={}, ready=[0, 1], ready_version=1)
    queue.claim("w1", "cpu1")
    worker_config = dataclasses.replace(config.current(), redis_url=redis_url)
    api.heartbeat_set(config=worker_config, name="ingest", host_id=host_id)
    api.role_take(config=worker_config, role="reconciler", owner="test", ttl_s=60, host_id=host_id)
    pipe = redis_client.pipeline()
    for stream in telemetry.STREAMS:
        pipe.xadd(telemetry.stream_key(host_id, stream), {"trial": "a1"})
    pipe.execute()
    seen.look()
    assert seen.patterns == {key.pattern for key in keys.HOST_KEYS}


def test_every_key_the_scripts_and_the_queue_name_is_in_the_key_map() -> None:
    lua = "".join(path.read_text() for path in (QUEUE / "lua").glob("*.lua"))
    python = "".join(path.read_text() for path in QUEUE.glob("*.py"))
    names = set(re.findall(r"key\('([a-z_]+)'\)", lua)) | set(re.findall(r"key\(\"([a-z_]+)\"\)", python))
    prefixes = set(re.findall(r"key\('([a-z_]+:)' \.\.", lua)) | set(re.findall(r"key\(f\"([a-z_]+:)\{", python))
    assert len(names) > 20 and prefixes == {"held:", "device:", "runnable:", "trial:", "widen:"}
    assert [name for name in names if keys.host_key(name) is None] == []
    patterns = [key.pattern for key in keys.HOST_KEYS]
    assert [p for p in prefixes if not any(pattern.startswith(p + "<") for pattern in patterns)] == []


def test_the_scheduler_doc_shows_the_key_map() -> None:
    assert keys.markdown_table() in (ROOT / "docs" / "scheduler.md").read_text()
