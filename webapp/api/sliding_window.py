"""Counting events in the last N seconds, in Redis, shared by every web server process.

A window keeps, per key, the times of the events it let in (a sorted set scored by milliseconds): an event is
let in while fewer than the limit fall within the last `seconds`, so no `seconds`-long stretch anywhere ever
holds more than the limit. A count per clock minute lets twice the limit through around a minute's turn (the
end of one minute and the start of the next), which this does not. One Lua script drops the times that left the
window, counts and adds, so concurrent requests cannot both take the last place. The times come from the web
servers' clocks (kept in step by NTP), passed in, so that a test can set them.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass

import redis
from redis.commands.core import Script

# KEYS[1] the window's key. ARGV: now (ms), window (ms), limit, a unique member, add (1: add when there is
# room; 0: only count). Returns {1, 0} when there is room, else {0, ms until the oldest time leaves}.
SCRIPT = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then
  if ARGV[5] == '1' then
    redis.call('ZADD', KEYS[1], now, ARGV[4])
    redis.call('PEXPIRE', KEYS[1], window)
  end
  return {1, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(oldest[2]) + window - now}
"""


@functools.cache
def _script(client: redis.Redis) -> Script:
    return client.register_script(SCRIPT)  # sent by its digest (EVALSHA), loaded again after a Redis restart


@dataclass(frozen=True)
class SlidingWindow:
    """Events of one kind (``prefix``) per key within the last `seconds`."""

    prefix: str
    seconds: float

    def take(self, client: redis.Redis, key: str, *, limit: int, now: float) -> float | None:
        """Count one event for `key` at `now` (epoch seconds) if fewer than `limit` are in the window: None;
        else count nothing and return the seconds until there is room. Raises redis.RedisError."""
        return self._run(client, key, limit=limit, now=now, add=True)

    def full(self, client: redis.Redis, key: str, *, limit: int, now: float) -> float | None:
        """The seconds until `key` has room again when `limit` events are in the window, else None; counts
        nothing. Raises redis.RedisError."""
        return self._run(client, key, limit=limit, now=now, add=False)

    def add(self, client: redis.Redis, key: str, *, now: float) -> None:
        """Count one event for `key` at `now`, whatever the count. Raises redis.RedisError."""
        pipe = client.pipeline()
        pipe.zadd(self._key(key), {uuid.uuid4().hex: int(now * 1000)})
        pipe.pexpire(self._key(key), int(self.seconds * 1000))
        pipe.execute()

    def _key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def _run(self, client: redis.Redis, key: str, *, limit: int, now: float, add: bool) -> float | None:
        allowed, wait_ms = _script(client)(keys=[self._key(key)], args=[
            int(now * 1000), int(self.seconds * 1000), limit, uuid.uuid4().hex, "1" if add else "0"])
        return None if int(allowed) else max(0.001, int(wait_ms) / 1000)
