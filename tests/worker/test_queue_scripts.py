"""The queue's Lua files, how they are put together, and how they run: the clock they take, a server that lost
them, a connection the server dropped (worker/scheduling/queue/scripts.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import redis

from tests.private_redis import PrivateRedis
from tests.worker.queue_helpers import SPEC, runnable, survey
from worker.scheduling.keys import EVENTS_MAXLEN
from worker.scheduling.policy import TIE_TOLERANCE
from worker.scheduling.queue import ShardQueue
from worker.scheduling.queue import scripts as queue_scripts
from worker.scheduling.queue.scripts import NAMES, Scripts, load, lua_file

LUA = resources.files("worker.scheduling.queue").joinpath("lua")


def included(name: str) -> list[str]:
    match = re.match(r"-- args:.*\n-- include:(.*)\n", lua_file(name))
    return match[1].split() if match else []


def test_every_lua_file_is_the_prelude_a_script_or_a_fragment_one_includes() -> None:
    files = {path.name.removesuffix(".lua") for path in LUA.iterdir() if path.name.endswith(".lua")}
    fragments = {fragment for name in NAMES for fragment in included(name)}
    assert fragments == {"speculative_claim"}
    assert files == {"prelude", *NAMES, *fragments}


def test_a_script_is_the_prelude_its_fragments_its_arguments_as_locals_then_its_file() -> None:
    survey_script = load("survey")
    assert survey_script.args == ("head", "base_walk", "device", "epoch", "holding", "claim", "plan")
    parts = [lua_file("prelude"), lua_file("speculative_claim"),
             "local head, base_walk, device, epoch, holding, claim, plan = ARGV[3], ARGV[4], ARGV[5], ARGV[6], "
             "ARGV[7], ARGV[8], ARGV[9]\n", lua_file("survey")]
    assert survey_script.source == "".join(parts)
    assert load("shares").source == lua_file("prelude") + lua_file("shares")  # no arguments: no line for them


def test_the_constants_are_written_into_every_script() -> None:
    for name in NAMES:
        assert not re.search(r"\$\{[A-Z_]+\}", load(name).source), name
    assert f"'MAXLEN', '~', {EVENTS_MAXLEN}," in load("complete").source
    assert f"(1 - {TIE_TOLERANCE!r})" in load("survey").source


def test_a_constant_the_python_code_does_not_define_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_scripts, "CONSTANTS", {})
    with pytest.raises(ValueError, match=r"lua/prelude.lua uses \$\{DEFAULT_LEASE_MS\}"):
        lua_file("prelude")


def test_a_script_takes_exactly_the_arguments_its_file_names(redis_client: redis.Redis, host_id: str) -> None:
    queue_scripts_ = Scripts(redis_client, f"hydra:{host_id}:")
    with pytest.raises(TypeError, match="script 'renew' takes id, token; got id"):
        queue_scripts_.run("renew", id="t1")
    assert queue_scripts_.run("renew", id="t1", token="1") == 0


def test_the_scripts_take_the_queue_s_clock_and_else_redis_s(redis_client: redis.Redis, host_id: str) -> None:
    seconds, _ = redis_client.time()
    ShardQueue(redis_client, host_id).submit(trial_id="t1", job=SPEC, export_dir="")
    clocked = ShardQueue(redis_client, host_id, clock=lambda: 4_000_000_000.0)
    clocked.submit(trial_id="t2", job=SPEC, export_dir="")
    assert abs(clocked.trial("t1").submitted - seconds) < 60
    assert clocked.trial("t2").submitted == 4_000_000_000.0
    clocked.register_host()  # the host's registration and its load read the same clock
    assert redis_client.zscore("hydra:hosts", host_id) == 4_000_000_000_000


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis server of this test's own: it flushes scripts and drops connections, which the shared one's
    other users must not see."""
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


def test_a_unit_s_round_trips_survive_a_server_that_lost_the_scripts(private: PrivateRedis) -> None:
    client = private.client()
    queue = ShardQueue(client, "h")
    runnable(queue, "t1")
    survey(queue)
    lease = queue.claim("t1", "cpu0")
    client.script_flush()  # as after a restart of the server
    state, seen, after = queue.complete_then_survey(
        lease, "epoch-1", remaining_units=2, unit_s=0.5, hold_s=2.0,
        also=lambda pipe: pipe.set(queue.key("also"), "sent"))
    assert (state, after.units_done, seen.alive) == ("running", 1, True)
    assert client.get(queue.key("also")) == "sent"
    client.script_flush()
    assert queue.renew("t1", after.token)  # one script alone
    assert queue.resume_all(["t1"]) == ["running"]  # several in one pipeline, none after telemetry


def test_a_unit_s_round_trips_survive_a_connection_the_server_dropped(private: PrivateRedis) -> None:
    client = private.client()
    queue = ShardQueue(client, "h")
    runnable(queue, "t1")
    survey(queue)
    lease = queue.claim("t1", "cpu0")
    admin = redis.Redis.from_url(private.url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1  # the queue's pooled connection
    state, seen, after = queue.complete_then_survey(lease, "epoch-1", remaining_units=2, unit_s=0.5, hold_s=2.0)
    assert (state, seen.alive) == ("running", True)
    admin.client_kill_filter(_type="normal", skipme=True)
    assert queue.renew("t1", after.token)
    assert queue.trial("t1").units_done == 1
    admin.close()
