"""Placing a new trial on one of a lab's hosts (worker/scheduling/placement.py), and the load a host reports."""

from __future__ import annotations

from worker.contract import SyntheticJob
from worker.scheduling.placement import HostLoad, place
from worker.scheduling.queue import ShardQueue


def load(host: str, devices: int = 2, capacity: int = 0, admitted: int = 0, trials: int = 0) -> HostLoad:
    return HostLoad(host_id=host, live_devices=devices, capacity_bytes=capacity, admitted_bytes=admitted,
                    trials=trials)


def test_a_trial_goes_to_the_least_loaded_host_that_can_hold_it() -> None:
    hosts = [load("gpu1", trials=3), load("gpu2", trials=1), load("gpu3", devices=8, trials=6)]
    assert place(hosts, 0, default="web") == "gpu3"  # 7 / 8 devices beats 2 / 2 and 4 / 2
    assert place([load("gpu1", trials=1), load("gpu2", trials=1)], 0, default="web") == "gpu1"  # then by id
    # More free host memory breaks a tie of load; a host whose tier can never hold the store is passed over.
    small, big = load("gpu1", capacity=100, admitted=50), load("gpu2", capacity=1000, admitted=50)
    assert place([small, big], 10, default="web") == "gpu2"
    assert place([small, load("gpu2", capacity=1000, trials=5)], 200, default="web") == "gpu2"
    # A host whose workers did not answer lately takes nothing; with none, the web app's own host does.
    assert place([load("gpu1", devices=0)], 0, default="web") == "web"
    assert place([], 0, default="web") == "web"


def test_a_host_registers_and_reports_its_load(redis_client, shard_queue: ShardQueue) -> None:
    shard_queue.register_host()
    assert shard_queue.host_id in redis_client.zrange("hydra:hosts", 0, -1)
    try:
        shard_queue.configure(capacity_bytes=1000)
        shard_queue.device_start("cpu0", "e1")
        shard_queue.survey("cpu0", "e1")  # a device is seen when it surveys
        shard_queue.submit(trial_id="t1", job=SyntheticJob(units=2), export_dir="", host_bytes=300)
        shard_queue.submit(trial_id="t2", job=SyntheticJob(units=2), export_dir="", host_bytes=300)
        job = shard_queue.claim_plan("cpu0")
        shard_queue.plan_done(job, remaining_units=2, unit_s=1.0, plan={})
        assert shard_queue.load() == HostLoad(host_id=shard_queue.host_id, live_devices=1, capacity_bytes=1000,
                                              admitted_bytes=300, trials=2)
        shard_queue.device_stop("cpu0")
        assert shard_queue.load().live_devices == 0  # a stopped worker's device takes no new trials
    finally:
        redis_client.zrem("hydra:hosts", shard_queue.host_id)
