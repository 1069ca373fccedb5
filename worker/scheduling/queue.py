"""The shard task queue: trial states, the runnable set and leases, in Redis, changed only by Lua scripts.

Every key of a host starts with ``hydra:<host>:`` (`keys.host_prefix`) so that several hosts can share one
Redis: a trial's spill store lives on one host and only that host's devices take its units. Everything is
readable with redis-cli::

    hydra:<host>:trials          ZSET   trial id -> submit time (s)             every trial of the host
    hydra:<host>:trial:<id>      HASH   state, job, export_dir, control, lease, device, last_device,
                                        held_until (ms: last_device keeps its activations until then),
                                        remaining_units, unit_s, units_done, requeues, replans, message,
                                        plan, submitted, updated, active; undo_* (what a speculative
                                        claim changed, for giving it back)
    hydra:<host>:planning        LIST   trial ids waiting to be planned (LPUSH in, RPOP out: FIFO)
    hydra:<host>:runnable:<team>:<priority>
                                 ZSET   trial id -> minus its remaining seconds  what Sharded-LRTF picks from
    hydra:<host>:runnable:<team>:<priority>:device:<name>, ...:base:<key>
                                 ZSET   the same, of the trials last run on a device / next reading a base
    hydra:<host>:held:<device>   SET    trials the device may hold the activations of (checked on survey)
    hydra:<host>:planners        HASH   device -> the trial it took to plan (one plans while others train)
    hydra:<host>:planning_teams  HASH   team -> its trials waiting to be planned
    hydra:<host>:leases          ZSET   trial id -> lease expiry (ms)          planning or running trials
    hydra:<host>:seq             STRING lease token counter (never below Redis's clock in ms times 1000)
    hydra:<host>:wake            LIST   wake-up tokens for idle devices (capped)
    hydra:<host>:reap            LIST   trials that ended cancelled or failed: a device frees their state
    hydra:<host>:config          HASH   lease_ms (default DEFAULT_LEASE_MS); clock_offset_ms (tests only)
    hydra:<host>:device:<name>   HASH   epoch (of the worker's current loop), stop, seen (last survey, s)
    hydra:<host>:heartbeats      HASH   process name (ingest) -> its last pass (s); `worker.api.heartbeat_set`
    hydra:<host>:role:<role>     STRING the process holding a role (reconciler), expiring; `worker.api.role_take`
    hydra:<host>:events          STREAM trial, state, message: state changes for the web app (not the
                                        runnable/running flips between units of a trial that goes on),
                                        capped at about `keys.EVENTS_MAXLEN` entries

States: planning -> runnable <-> running -> finished | failed; paused; cancelled. Pause and cancel of a
trial whose unit (or planning) is in flight set ``control`` and take effect when that unit ends. A lease
that expires (its worker died) puts the trial back, so another device re-runs the same unit from the spill
store. Times come from Redis's clock, so hosts with skewed clocks agree on lease expiry; tests move that
clock forward (`ShardQueue.advance_clock_for_tests`) instead of sleeping past a lease.

Each script is the shared prelude, a line naming its arguments as locals (``local id, token = ARGV[2],
ARGV[3]``, made by `_script` from the names written beside the body), then the body, which reads ARGV no
more. ARGV[1] is the key prefix, read by the prelude. Python passes the arguments by those names, so their
order is written once.

The policy stays in Python (`worker.scheduling.policy`): `survey` reads the candidates, the caller picks,
and `claim` takes that exact trial atomically, failing harmlessly if another device was faster. A device
loop may ask its survey to claim its guess of that pick in the same script; the pick, made from the survey
as taken before that claim, then confirms the claim or gives it back (`unclaim_then_claim`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

try:
    import hiredis
except ImportError:  # redis-py packs and parses in Python then
    hiredis = None

from worker.contract import (
    InvalidTransition,
    Job,
    LeaseLost,
    QueueError,
    TrialExists,
    TrialNotFound,
    TrialRecord,
    job_from_dict,
)
from worker.scheduling.fair_share import PRIORITIES, USAGE_HALF_LIFE_S
from worker.scheduling.keys import EVENTS_MAXLEN, HOSTS_KEY, host_prefix
from worker.scheduling.placement import HostLoad
from worker.scheduling.policy import TIE_TOLERANCE, BaseShard, Candidate, Shares, remaining_seconds

__all__ = ["InvalidTransition", "Lease", "LeaseLost", "PlanJob", "QueueError", "ShardQueue", "Survey",
           "TrialExists", "TrialNotFound", "TrialRecord"]

DEFAULT_LEASE_MS = 10_000
TRIAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TEAM_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")  # '' is the team of trials submitted without one
PLANNING_SCAN = 256  # trials waiting to be planned that one claim considers for admission, oldest first
# What a survey reads of each team's runnable set (see `_SURVEY`): its longest trials that no other device
# holds, and of one shared base's trials the longest that the affinity rule may look at. Both are bounds that
# keep a survey's cost flat however many trials are runnable; the policy's choice over them is its choice over
# the whole set, except that a base's trials beyond the first SURVEY_BASE_WALK are not tried for affinity.
SURVEY_HEAD = 4
SURVEY_BASE_WALK = 16


# Shared Lua prelude: key names, the Redis clock, leases and the state-change event. The Python constants
# DEFAULT_LEASE_MS and EVENTS_MAXLEN are written into it.
_PRELUDE = """
local P = ARGV[1]
local function key(name) return P .. name end
local function tkey(id) return P .. 'trial:' .. id end
-- Redis's clock (one reading per script: a script is atomic), moved by the host's clock_offset_ms, which only
-- tests set (`ShardQueue.advance_clock_for_tests`) to expire a lease or lapse a hold without sleeping.
-- The host's settings a script uses are read once, on first use (a script runs many times per unit).
local CONFIG
local function config()
  if not CONFIG then
    local c = redis.call('HMGET', key('config'), 'clock_offset_ms', 'lease_ms', 'half_life_ms')
    CONFIG = {offset = tonumber(c[1] or '0'), lease = tonumber(c[2] or 'DEFAULT_LEASE_MS'),
              half_life = tonumber(c[3] or 'HALF_LIFE_MS')}
  end
  return CONFIG
end
local NOW
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + config().offset
  end
  return NOW
end
local function lease_ms()
  return config().lease
end
-- Lease `id` to `device` for the host's lease length: a new token, kept on the trial, and the expiry in the
-- leases set. Returns the token and the lease length (ms).
-- Tokens fence the spill store, which keeps the largest it saw, so they must grow even across a Redis that
-- lost its data (emptied, or restarted from an append-only file a second behind): no token is below the
-- clock's milliseconds times 1000, which exceeds every token granted before (at most 1000 a millisecond).
local function grant_lease(id, device)
  local seq = redis.call('INCR', key('seq'))
  local floor = now_ms() * 1000
  if seq < floor then
    seq = floor
    redis.call('SET', key('seq'), string.format('%d', floor))
  end
  local token = string.format('%d', seq)
  local ms = lease_ms()
  redis.call('HSET', tkey(id), 'lease', token, 'device', device)
  redis.call('ZADD', key('leases'), now_ms() + ms, id)
  return token, ms
end
-- Fair share (worker.scheduling.fair_share, whose rules these mirror): per team, its usage in device seconds
-- decayed by half every half_life_ms, as of usage_at; its weight (1 when unset); when it was last served.
local function half_life_ms()
  return config().half_life
end
local function usage_of(team)
  local u = redis.call('HMGET', key('usage'), team, team .. '@')
  if not u[1] then return 0 end
  return tonumber(u[1]) * 0.5 ^ (math.max(0, now_ms() - tonumber(u[2])) / half_life_ms())
end
local function set_usage(team, value)
  redis.call('HSET', key('usage'), team, value, team .. '@', now_ms())
end
local function weight_of(team)
  return tonumber(redis.call('HGET', key('weights'), team) or '1')
end
-- A team gains or loses a trial with work (runnable or running); one that gains its first arrives: its usage
-- starts at the least usage per weight of the teams already with work, times its weight, unless its own is
-- larger (fair_share.arrival_usage).
local function team_work(id, gains)
  local team = redis.call('HGET', tkey(id), 'team') or ''
  local count = redis.call('HINCRBY', key('team_work'), team, gains and 1 or -1)
  if gains and count == 1 then
    local least
    for _, other in ipairs(redis.call('SMEMBERS', key('teams'))) do
      local share = usage_of(other) / weight_of(other)
      if not least or share < least then least = share end
    end
    set_usage(team, math.max(usage_of(team), (least or 0) * weight_of(team)))
    redis.call('SADD', key('teams'), team)
  elseif count <= 0 then
    redis.call('HDEL', key('team_work'), team)
    redis.call('SREM', key('teams'), team)
  end
end
-- A unit of `id` was leased: its team is charged the trial's unit-time estimate, and served now.
local function charge(id)
  local t = redis.call('HMGET', tkey(id), 'team', 'unit_s')
  local team = t[1] or ''
  set_usage(team, usage_of(team) + tonumber(t[2] or '0'))
  redis.call('HSET', key('served'), team, now_ms())
end
-- The runnable sets a trial is in while runnable: its team and priority's, scored by minus its remaining
-- seconds, so that ZRANGE lists the longest first and, among equal times, the smallest id first (the
-- policy's order); and beside it two small views of the same trials for the policy's affinity, per device
-- the trials whose last unit ran there, and per shared base the trials whose next unit reads its layers.
-- The fields they are keyed by (last_device, next_base) change only while a trial is out of them (leased).
local function runnable_keys(id)
  local t = redis.call('HMGET', tkey(id), 'team', 'priority', 'last_device', 'next_base')
  local set = key('runnable:' .. (t[1] or '') .. ':' .. (t[2] or '1'))
  local by_device, by_base
  if t[3] and t[3] ~= '' then by_device = set .. ':device:' .. t[3] end
  if t[4] and t[4] ~= '' then by_base = set .. ':base:' .. string.match(t[4], '^(.*):%d+:%d+$') end
  return set, by_device, by_base
end
local function runnable_add(id, score)
  local set, by_device, by_base = runnable_keys(id)
  redis.call('ZADD', set, score, id)
  if by_device then redis.call('ZADD', by_device, score, id) end
  if by_base then redis.call('ZADD', by_base, score, id) end
end
-- 1 if `id` was runnable (and is no longer), else 0.
local function runnable_remove(id)
  local set, by_device, by_base = runnable_keys(id)
  if by_device then redis.call('ZREM', by_device, id) end
  if by_base then redis.call('ZREM', by_base, id) end
  return redis.call('ZREM', set, id)
end
-- The bytes of the host tier trials' stores may take (0: no limit): what an administrator set for the host,
-- else what its workers found when they started.
local function capacity_of_host()
  local c = redis.call('HMGET', key('config'), 'capacity_override_bytes', 'capacity_bytes')
  return tonumber(c[1] or c[2] or '0')
end
-- Admission: a trial may make its spill store (be planned) once its team is under its quotas (trials and
-- bytes admitted at once) and the host tier has room for its bytes; it stays admitted, its store on the
-- host, until it ends. Returns true, or false and why it waits.
local function admissible(id)
  if redis.call('HEXISTS', key('admitted'), id) == 1 then return true end
  local t = redis.call('HMGET', tkey(id), 'team', 'host_bytes')
  local team, bytes = t[1] or '', tonumber(t[2] or '0')
  local quota = tonumber(redis.call('HGET', key('quotas'), team) or '0')
  if quota > 0 and tonumber(redis.call('HGET', key('team_admitted'), team) or '0') >= quota then
    return false, 'Waits for a place: its team has ' .. quota .. ' trials on this host at once, its quota.'
  end
  local byte_quota = tonumber(redis.call('HGET', key('byte_quotas'), team) or '0')
  local team_bytes = tonumber(redis.call('HGET', key('team_bytes'), team) or '0')
  if byte_quota > 0 and team_bytes + bytes > byte_quota then
    return false, string.format('Waits for host memory of its team: its state needs %.0f MB, and the ' ..
                                'other trials of its team take %.0f MB of its quota of %.0f MB on this host.',
                                bytes / 1e6, team_bytes / 1e6, byte_quota / 1e6)
  end
  local capacity = capacity_of_host()
  local used = tonumber(redis.call('GET', key('admitted_bytes')) or '0')
  if capacity > 0 and used + bytes > capacity then
    return false, string.format('Waits for host memory: its state needs %.0f MB, and other trials take %.0f MB ' ..
                                'of the %.0f MB the host tier may hold.', bytes / 1e6, used / 1e6, capacity / 1e6)
  end
  return true
end
-- Trials waiting to be planned that a device may take: none while the last admission scan found none it
-- could admit and nothing has changed since that could admit one (a trial submitted or requeued, one ending,
-- quotas or capacity set: each clears `planning_blocked`). So a host whose waiting trials wait for room costs
-- its devices no scan per unit.
local function plannable()
  if redis.call('EXISTS', key('planning_blocked')) == 1 then return 0 end
  return redis.call('LLEN', key('planning'))
end
-- Whether a device other than `device` is planning a trial now: then `device` goes on training rather than
-- plan too, so that planning many trials takes one device from training at a time (`planners`: device ->
-- the trial it last took to plan; an entry whose trial is planned or whose lease lapsed is dropped here).
local function planning_elsewhere(device)
  local planners = redis.call('HGETALL', key('planners'))
  for i = 1, #planners, 2 do
    local other, id = planners[i], planners[i + 1]
    local t = redis.call('HMGET', tkey(id), 'state', 'device', 'lease')
    if t[1] ~= 'planning' or t[2] ~= other or not t[3] then
      redis.call('HDEL', key('planners'), other)
    elseif other ~= device then
      return true
    end
  end
  return false
end
-- The list of trials waiting to be planned, oldest at its right end, and per team how many wait (so that an
-- admission scan knows the least share among the waiting teams before it reads them all).
local function planning_add(id, oldest)
  redis.call(oldest and 'RPUSH' or 'LPUSH', key('planning'), id)
  redis.call('HINCRBY', key('planning_teams'), redis.call('HGET', tkey(id), 'team') or '', 1)
  redis.call('DEL', key('planning_blocked'))
end
-- 1 if `id` was waiting to be planned (and is no longer), else 0.
local function planning_remove(id)
  local removed = redis.call('LREM', key('planning'), 0, id)
  if removed > 0 then
    local team = redis.call('HGET', tkey(id), 'team') or ''
    if redis.call('HINCRBY', key('planning_teams'), team, -1) <= 0 then
      redis.call('HDEL', key('planning_teams'), team)
    end
  end
  return removed
end
local function admit(id)
  if redis.call('HEXISTS', key('admitted'), id) == 1 then return end
  local t = redis.call('HMGET', tkey(id), 'team', 'host_bytes')
  redis.call('HSET', key('admitted'), id, t[2] or '0')
  redis.call('INCRBY', key('admitted_bytes'), string.format('%d', tonumber(t[2] or '0')))
  redis.call('HINCRBY', key('team_admitted'), t[1] or '', 1)
  redis.call('HINCRBY', key('team_bytes'), t[1] or '', string.format('%d', tonumber(t[2] or '0')))
end
local function unadmit(id)
  local bytes = redis.call('HGET', key('admitted'), id)
  if not bytes then return end
  redis.call('HDEL', key('admitted'), id)
  redis.call('DECRBY', key('admitted_bytes'), string.format('%d', tonumber(bytes)))
  local team = redis.call('HGET', tkey(id), 'team') or ''
  redis.call('HINCRBY', key('team_admitted'), team, -1)
  redis.call('HINCRBY', key('team_bytes'), team, string.format('%d', -tonumber(bytes)))
  redis.call('DEL', key('planning_blocked'))
end
-- Every change is published on the events stream except the runnable <-> running flips between the units of
-- a trial that keeps training: those happen per unit and say nothing new ('active' marks such a trial).
local function set_state(id, state, message, quiet, steps_done, rung)
  local before = redis.call('HGET', tkey(id), 'state')
  local was = before == 'runnable' or before == 'running'
  local is = state == 'runnable' or state == 'running'
  if was ~= is then team_work(id, is) end
  redis.call('HSET', tkey(id), 'state', state, 'message', message or '', 'updated', now_ms() / 1000)
  if state == 'finished' or state == 'pruned' or state == 'cancelled' or state == 'failed' then unadmit(id) end
  -- No unit of it will run again (a retry is a new trial): the next survey on this host frees its state.
  if state == 'cancelled' or state == 'failed' then redis.call('LPUSH', key('reap'), id) end
  if quiet then return end
  local fields = {'trial', id, 'state', state, 'message', message or ''}
  if steps_done then
    fields[#fields + 1], fields[#fields + 2] = 'steps_done', steps_done
  end
  if rung then
    fields[#fields + 1], fields[#fields + 2] = 'rung', rung
  end
  redis.call('XADD', key('events'), 'MAXLEN', '~', EVENTS_MAXLEN, '*', unpack(fields))
  if state == 'running' then redis.call('HSET', tkey(id), 'active', '1')
  else redis.call('HDEL', tkey(id), 'active') end
end
local function wake()
  if redis.call('LPUSH', key('wake'), '1') > 64 then redis.call('LTRIM', key('wake'), 0, 63) end
end
local function make_runnable(id, quiet, message)
  local remaining = redis.call('HMGET', tkey(id), 'remaining_units', 'unit_s')
  runnable_add(id, -(tonumber(remaining[1]) * tonumber(remaining[2])))
  set_state(id, 'runnable', message, quiet)
  wake()
end
-- End a lease: 'ok', or 'lost' when the token is no longer the trial's (it expired and was requeued).
local function release(id, token)
  if redis.call('HGET', tkey(id), 'lease') ~= token then return 'lost' end
  redis.call('HDEL', tkey(id), 'lease')
  redis.call('ZREM', key('leases'), id)
  return 'ok'
end
-- Where a trial goes when its unit ends without finishing it: honour a pending pause or cancel.
local function after_unit(id, quiet, message)
  local control = redis.call('HGET', tkey(id), 'control')
  if control then redis.call('HDEL', tkey(id), 'control') end
  if control == 'cancel' then set_state(id, 'cancelled'); return 'cancelled'
  elseif control == 'pause' then set_state(id, 'paused'); return 'paused' end
  make_runnable(id, quiet, message)
  return 'runnable'
end
-- Lease the next unit of the first of `ids` (trial ids separated by spaces, best first) that is runnable:
-- {id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s}, or false when none is. A
-- speculative claim, made in the same script as the survey the device's policy has not yet seen, keeps what
-- it changes besides the lease (undo_* fields) for `_UNCLAIM`, should the policy choose another trial.
local function claim_first(ids, device, speculative)
  for id in string.gmatch(ids, '%S+') do
    if runnable_remove(id) == 1 then
      local t = redis.call('HMGET', tkey(id), 'team', 'device', 'message', 'active')
      if speculative then
        redis.call('HSET', tkey(id), 'undo_device', t[2] or '', 'undo_message', t[3] or '',
                   'undo_active', t[4] or '', 'undo_served', redis.call('HGET', key('served'), t[1] or '') or '')
      end
      local token, ms = grant_lease(id, device)
      charge(id)
      set_state(id, 'running', nil, t[4] == '1')
      local u = redis.call('HMGET', tkey(id), 'units_done', 'job', 'export_dir', 'remaining_units', 'unit_s')
      return {id, token, ms, u[1], u[2], u[3], u[4], u[5]}
    end
  end
  return false
end
-- Take a trial waiting to be planned, with a lease: {id, token, lease_ms, job}, or false when none waits, or
-- when the device is not `idle` (it has units to run) and another device is planning: planning takes one
-- device at a time from training. Of the oldest `PLANNING_SCAN` trials waiting to be planned, the admissible
-- ones (see admissible) go in fair-share order of their teams, the oldest first within a team; the others
-- keep waiting, with the reason in their message. A trial whose state alone exceeds the host tier fails,
-- saying so.
local function claim_plan(device, idle)
  if not idle and planning_elsewhere(device) then return false end
  local waiting = redis.call('LRANGE', key('planning'), -PLANNING_SCAN, -1)
  local capacity = capacity_of_host()
  -- No waiting trial can come before one of a team with the least share among the waiting teams, and ties go
  -- to the oldest: the scan ends at the first such trial it can admit (at once when nothing is over a quota).
  local least
  local waiting_teams = redis.call('HGETALL', key('planning_teams'))
  for i = 1, #waiting_teams, 2 do
    local share = usage_of(waiting_teams[i]) / weight_of(waiting_teams[i])
    if not least or share < least then least = share end
  end
  local best, best_share
  for i = #waiting, 1, -1 do
    local id = waiting[i]
    local t = redis.call('HMGET', tkey(id), 'team', 'host_bytes')
    local bytes = tonumber(t[2] or '0')
    if capacity > 0 and bytes > capacity then
      planning_remove(id)
      set_state(id, 'failed', string.format('Its state needs %.0f MB on the host tier, which holds %.0f MB ' ..
                                            'on this host: lower the model size or batch.', bytes / 1e6,
                                            capacity / 1e6))
    else
      local ok, why = admissible(id)
      if ok then
        local team = t[1] or ''
        local share = usage_of(team) / weight_of(team)
        if not best or share < best_share then best, best_share = id, share end
        if least and best_share <= least then break end
      else
        redis.call('HSET', tkey(id), 'message', why)
      end
    end
  end
  if not best then
    redis.call('SET', key('planning_blocked'), '1')
    return false
  end
  planning_remove(best)
  admit(best)
  redis.call('HSET', tkey(best), 'message', '')
  local token, ms = grant_lease(best, device)
  redis.call('HSET', key('planners'), device, best)
  return {best, token, ms, redis.call('HGET', tkey(best), 'job')}
end
""".replace("DEFAULT_LEASE_MS", str(DEFAULT_LEASE_MS)).replace(
    "HALF_LIFE_MS", str(int(USAGE_HALF_LIFE_S * 1000))).replace("EVENTS_MAXLEN", str(EVENTS_MAXLEN)).replace(
    "PLANNING_SCAN", str(PLANNING_SCAN))


class _Script(NamedTuple):
    names: tuple[str, ...]  # of its arguments ARGV[2], ARGV[3]..., in order
    source: str


def _script(names: str, body: str) -> _Script:
    """A script taking the space-separated `names` as arguments: the prelude, a line naming them as locals,
    then `body`."""
    args = tuple(names.split())
    if not args:
        return _Script(args, f"{_PRELUDE}{body}")
    argv = ", ".join(f"ARGV[{index}]" for index in range(2, len(args) + 2))
    return _Script(args, f"{_PRELUDE}local {', '.join(args)} = {argv}\n{body}")

# `paused` '1': the trial is planned, then waits paused (a pause asked at once, as `pause` would ask it).
_SUBMIT = _script("id job export_dir team priority host_bytes paused", """
if redis.call('EXISTS', tkey(id)) == 1 then return 'exists' end
local now = now_ms() / 1000
redis.call('HSET', tkey(id), 'job', job, 'export_dir', export_dir, 'submitted', now, 'units_done', 0,
           'requeues', 0, 'team', team, 'priority', priority, 'host_bytes', host_bytes)
if paused == '1' then redis.call('HSET', tkey(id), 'control', 'pause') end
redis.call('ZADD', key('trials'), now, id)
planning_add(id, false)
set_state(id, 'planning')
wake()
return 'ok'
""")

# Check that the calling device loop is still the device's current one (its worker did not restart or
# stop), requeue expired leases, then report how many trials wait to be planned, one ended trial whose
# state the caller must free, and the candidates the policy needs to decide as it would over every runnable
# trial, each with its last device, units done and the device holding its activations (its last device,
# until held_until). What it reads does not grow with the runnable trials (see `_survey_from` for the layout):
# - the trials this device holds (`held:<device>`, of any team): the policy runs one of them first;
# - per team with work, in its highest priority with runnable trials: the head of its set, up to `head`
#   trials no other device holds (held ones go out too, marked, but there are at most as many as devices);
# - and, of those within the tie tolerance of the longest, the affinity views: the longest whose last unit
#   ran on this device, and the longest (of the first `base_walk`) whose next unit reads base layers that
#   overlap `holding`, the layers the device holds (policy.BaseShard's text, or '').
# Returns {survey, claimed, planned}. With `plan` '1', a device that is to plan next (trials wait to be
# planned and no other device plans) takes one here (see claim_plan) and `planned` is that job. Else `claim`
# names trials (best first, or ''), the device's guess of what its policy will choose from this survey: the
# script leases the first of them still runnable (a speculative claim, see claim_first) and `claimed` is
# that lease. Both are false when not taken, and when the loop must end.
_SURVEY = _script("head base_walk device epoch holding claim plan", """
head, base_walk = tonumber(head), tonumber(base_walk)
local dkey = key('device:' .. device)
local loop = redis.call('HMGET', dkey, 'epoch', 'stop', 'seen')
-- A device Redis lost (emptied): the loop asking is its current one; it goes on and says so.
if not loop[1] then
  redis.call('HSET', dkey, 'epoch', epoch, 'stop', '0')
  loop = {epoch, '0'}
end
-- {0}: the loop must end.
if loop[1] ~= epoch or loop[2] == '1' then return {{0}, false, false} end
-- When the device was last seen, to the second (`load`): not rewritten at every unit.
if not loop[3] or now_ms() / 1000 - tonumber(loop[3]) >= 1 then redis.call('HSET', dkey, 'seen', now_ms() / 1000) end
local expired = redis.call('ZRANGEBYSCORE', key('leases'), '-inf', now_ms())
for _, id in ipairs(expired) do
  redis.call('ZREM', key('leases'), id)
  redis.call('HDEL', tkey(id), 'lease', 'held_until')
  redis.call('HINCRBY', tkey(id), 'requeues', 1)
  local state = redis.call('HGET', tkey(id), 'state')
  if state == 'planning' then
    planning_add(id, true)
    wake()
  elseif state == 'running' then
    after_unit(id, false, 'lease of ' .. redis.call('HGET', tkey(id), 'device') .. ' expired; the unit runs again')
  end
end
-- Else {1, planning, elsewhere, reap, teams, then per team with work: team, usage, weight, served (ms, '' if
-- never), then per candidate: id, remaining_s, last_device, units_done, held_by, next_base, team, priority}:
-- planning counts the trials waiting to be planned, elsewhere is 1 when another device is planning one (a
-- device with units to run then runs them, without asking to plan); '' stands for no trial to reap, no last
-- device, no holder, no base layers read by the next unit.
local teams = redis.call('SMEMBERS', key('teams'))
local planning = plannable()
local out = {1, planning, (planning > 0 and planning_elsewhere(device)) and 1 or 0,
             redis.call('RPOP', key('reap')) or '', #teams}
for _, team in ipairs(teams) do
  table.insert(out, team)
  table.insert(out, tostring(usage_of(team)))
  table.insert(out, tostring(weight_of(team)))
  table.insert(out, redis.call('HGET', key('served'), team) or '')
end
local seen = {}
-- Add a candidate once, from its runnable set's score (minus its remaining seconds); returns its remaining
-- seconds and its holder ('' when none).
local function candidate(id, score, team, priority)
  local remaining = tonumber(score)
  remaining = remaining == 0 and 0 or -remaining
  local extra = redis.call('HMGET', tkey(id), 'last_device', 'units_done', 'held_until', 'next_base')
  local held_by = (tonumber(extra[3] or '0') > now_ms()) and extra[1] or ''
  if not seen[id] then
    seen[id] = true
    for _, value in ipairs({id, string.format('%.17g', remaining), extra[1] or '', extra[2] or '0', held_by,
                            extra[4] or '', team, priority}) do
      table.insert(out, value)
    end
  end
  return remaining, held_by, extra[4] or ''
end
local held = key('held:' .. device)
for _, id in ipairs(redis.call('SMEMBERS', held)) do
  local t = redis.call('HMGET', tkey(id), 'state', 'last_device', 'held_until', 'team', 'priority')
  if t[2] ~= device or tonumber(t[3] or '0') <= now_ms() or (t[1] ~= 'runnable' and t[1] ~= 'running') then
    redis.call('SREM', held, id)
  elseif t[1] == 'runnable' then
    local priority = t[5] or '1'
    local score = redis.call('ZSCORE', key('runnable:' .. (t[4] or '') .. ':' .. priority), id)
    if score then candidate(id, score, t[4] or '', priority) end
  end
end
local held_first, held_stop
if holding ~= '' then
  held_first, held_stop = string.match(holding, ':(%d+):(%d+)$')
  held_first, held_stop = tonumber(held_first), tonumber(held_stop)
end
for _, team in ipairs(teams) do
  for priority = 2, 0, -1 do
    local set = key('runnable:' .. team .. ':' .. priority)
    local longest, found, offset, any = nil, 0, 0, false
    while found < head do
      local chunk = redis.call('ZRANGE', set, offset, offset + head - 1, 'WITHSCORES')
      if #chunk == 0 then break end
      any = true
      for i = 1, #chunk, 2 do
        local remaining, held_by = candidate(chunk[i], chunk[i + 1], team, priority)
        if held_by == '' or held_by == device then
          found = found + 1
          longest = longest or remaining
        end
      end
      if #chunk < 2 * head then break end  -- the set's end
      offset = offset + head
    end
    if longest then
      local floor = longest * (1 - TIE_TOLERANCE)
      local mine = redis.call('ZRANGE', set .. ':device:' .. device, 0, 0, 'WITHSCORES')
      if #mine > 0 and -tonumber(mine[2]) >= floor then candidate(mine[1], mine[2], team, priority) end
      if held_first then
        local base = string.match(holding, '^(.*):%d+:%d+$')
        local walk = redis.call('ZRANGE', set .. ':base:' .. base, 0, base_walk - 1, 'WITHSCORES')
        for i = 1, #walk, 2 do
          if -tonumber(walk[i + 1]) < floor then break end
          local first, stop = string.match(redis.call('HGET', tkey(walk[i]), 'next_base') or '', ':(%d+):(%d+)$')
          if first and tonumber(first) < held_stop and held_first < tonumber(stop) then
            local _, held_by = candidate(walk[i], walk[i + 1], team, priority)
            if held_by == '' or held_by == device then break end
          end
        end
      end
    end
    if any then break end
  end
end
-- A device plans next when trials wait to be planned and no other device plans them (see claim_plan).
local claimed, planned = false, false
if planning > 0 and out[3] == 0 then
  if plan == '1' then
    planned = claim_plan(device, false)
    if not planned then out[2] = plannable() end  -- none could be admitted: none to plan
  end
end
if not planned and claim ~= '' and (out[2] == 0 or out[3] == 1) then claimed = claim_first(claim, device, true) end
return {out, claimed, planned}
""".replace("TIE_TOLERANCE", repr(TIE_TOLERANCE)))

_CLAIM_PLAN = _script("device idle", """
return claim_plan(device, idle == '1')
""")

# `units_done` > 0: the trial's state already held that many units (a resubmitted trial resumes from it).
_PLAN_DONE = _script("id token remaining_units unit_s plan units_done", """
if release(id, token) == 'lost' then return 'lost' end
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan)
if tonumber(units_done) > 0 then redis.call('HSET', tkey(id), 'units_done', units_done) end
return after_unit(id, false)
""")

# Returns {token, lease_ms, units_done, job, export_dir, remaining_units, unit_s}, or nil when the trial is
# not runnable (another device took it first).
# `ids`: trial ids separated by spaces, in the caller's order of preference: the first still runnable is
# claimed. Returns {id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s}, or nil when none
# is (other devices took them first).
_CLAIM = _script("ids device", """
return claim_first(ids, device, false)
""")

# A speculative claim (see claim_first) that the device's policy did not confirm: the lease ends, the team
# gets back the unit time it was charged and its last service as it was, and the trial goes back as the end
# of a unit would put it: runnable (with the state event it had, if the claim published one), or paused or
# cancelled when that was asked meanwhile. Returns its state, or 'lost'.
_UNCLAIM = _script("id token", """
if release(id, token) == 'lost' then return 'lost' end
local t = redis.call('HMGET', tkey(id), 'team', 'unit_s', 'undo_device', 'undo_message', 'undo_active',
                     'undo_served')
local team = t[1] or ''
set_usage(team, math.max(0, usage_of(team) - tonumber(t[2] or '0')))
if t[6] and t[6] ~= '' then redis.call('HSET', key('served'), team, t[6])
else redis.call('HDEL', key('served'), team) end
redis.call('HSET', tkey(id), 'device', t[3] or '')
redis.call('HDEL', tkey(id), 'undo_device', 'undo_message', 'undo_active', 'undo_served')
return after_unit(id, t[5] == '1', t[4] ~= '' and t[4] or nil)
""")

_RENEW = _script("id token", """
if redis.call('HGET', tkey(id), 'lease') ~= token then return 0 end
redis.call('ZADD', key('leases'), 'XX', now_ms() + lease_ms(), id)
return 1
""")

# `device` ran the unit; `steps_done` (or '') goes with the finished event; `hold_ms` > 0 says it keeps the
# trial's activations that long; `epoch` is its loop's, or '' when the caller does not go on with a held
# trial; `next_base` the shared base layers the trial's next unit reads (policy.BaseShard's text, or '').
# Returns the trial's state, 'lost', or {token, lease_ms} of the next unit when the device goes on.
_COMPLETE = _script("id token remaining_units unit_s device message steps_done hold_ms epoch next_base ended rung",
                    """
remaining_units, hold_ms = tonumber(remaining_units), tonumber(hold_ms)
if release(id, token) == 'lost' then return 'lost' end
redis.call('HINCRBY', tkey(id), 'units_done', 1)
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'last_device', device,
           'next_base', next_base)
if hold_ms > 0 then
  redis.call('HSET', tkey(id), 'held_until', now_ms() + hold_ms)
  redis.call('SADD', key('held:' .. device), id)
elseif redis.call('HDEL', tkey(id), 'held_until') == 1 then
  redis.call('SREM', key('held:' .. device), id)
end
if remaining_units == 0 then
  redis.call('HDEL', tkey(id), 'control')
  set_state(id, ended, message, false, steps_done ~= '' and steps_done or nil, rung ~= '' and rung or nil)
  return ended
end
-- The device holds the trial and its loop `epoch` goes on: it runs the next unit too (the policy's choice,
-- see policy.py), so lease it at once, unless a pause or cancel waits, or a trial waits to be planned and
-- no other device is planning (this one would leave training to plan).
if hold_ms > 0 and epoch ~= '' and not redis.call('HGET', tkey(id), 'control')
    and (plannable() == 0 or planning_elsewhere(device)) then
  local loop = redis.call('HMGET', key('device:' .. device), 'epoch', 'stop')
  if loop[1] == epoch and loop[2] ~= '1' then
    local next_token, ms = grant_lease(id, device)
    charge(id)
    return {next_token, ms}
  end
end
return after_unit(id, redis.call('HGET', tkey(id), 'active') == '1')
""")

# A unit ran out of device memory and the trial was re-planned with smaller shards: the unit did not complete
# (units_done stays), its trial takes the new plan and unit count and goes back to the runnable set, with an
# event saying why.
_REPLAN = _script("id token remaining_units unit_s plan device message", """
if release(id, token) == 'lost' then return 'lost' end
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan,
           'last_device', device)
redis.call('HDEL', tkey(id), 'held_until', 'next_base')
redis.call('HINCRBY', tkey(id), 'replans', 1)
return after_unit(id, false, message)
""")

_FAIL = _script("id token message", """
if release(id, token) == 'lost' then return 'lost' end
redis.call('HDEL', tkey(id), 'control')
set_state(id, 'failed', message)
return 'failed'
""")

# Control: each returns the trial's state afterwards, 'missing', or 'invalid:<state>'.
_PAUSE = _script("id", """
local state = redis.call('HGET', tkey(id), 'state')
if not state then return 'missing' end
if state == 'runnable' then
  runnable_remove(id)
  set_state(id, 'paused')
elseif state == 'running' or state == 'planning' then
  redis.call('HSET', tkey(id), 'control', 'pause')
elseif state ~= 'paused' then
  return 'invalid:' .. state
end
return redis.call('HGET', tkey(id), 'state')
""")

_RESUME = _script("id", """
local state = redis.call('HGET', tkey(id), 'state')
if not state then return 'missing' end
if state == 'paused' then
  make_runnable(id, false)
elseif state == 'running' or state == 'planning' then
  if redis.call('HGET', tkey(id), 'control') == 'pause' then redis.call('HDEL', tkey(id), 'control') end
elseif state ~= 'runnable' then
  return 'invalid:' .. state
end
return redis.call('HGET', tkey(id), 'state')
""")

_CANCEL = _script("id", """
local state = redis.call('HGET', tkey(id), 'state')
if not state then return 'missing' end
if state == 'runnable' or state == 'paused' then
  runnable_remove(id)
  set_state(id, 'cancelled')
elseif state == 'planning' and planning_remove(id) > 0 then
  set_state(id, 'cancelled')
elseif state == 'running' or state == 'planning' then
  redis.call('HSET', tkey(id), 'control', 'cancel')
elseif state ~= 'cancelled' then
  return 'invalid:' .. state
end
return redis.call('HGET', tkey(id), 'state')
""")

# Runnable sets written before they were scored by minus the remaining time and had their affinity views
# are rewritten, and the waiting teams counted, once per host (a worker of this version starting on a Redis
# that older workers filled).
_UPGRADE = _script("", """
if redis.call('GET', key('layout')) == '2' then return 0 end
local moved = 0
for _, id in ipairs(redis.call('ZRANGE', key('trials'), 0, -1)) do
  if redis.call('HGET', tkey(id), 'state') == 'runnable' then
    local remaining = redis.call('HMGET', tkey(id), 'remaining_units', 'unit_s')
    runnable_remove(id)
    runnable_add(id, -(tonumber(remaining[1]) * tonumber(remaining[2])))
    moved = moved + 1
  end
end
redis.call('DEL', key('planning_teams'))
for _, id in ipairs(redis.call('LRANGE', key('planning'), 0, -1)) do
  redis.call('HINCRBY', key('planning_teams'), redis.call('HGET', tkey(id), 'team') or '', 1)
end
redis.call('SET', key('layout'), '2')
return moved
""")

# Read only: {teams, then per team with work: team, usage, weight, served (ms, '' if never)}.
_SHARES = _script("", """
local teams = redis.call('SMEMBERS', key('teams'))
local out = {#teams}
for _, team in ipairs(teams) do
  table.insert(out, team)
  table.insert(out, tostring(usage_of(team)))
  table.insert(out, tostring(weight_of(team)))
  table.insert(out, redis.call('HGET', key('served'), team) or '')
end
return out
""")

_SCRIPTS = {
    "submit": _SUBMIT,
    "shares": _SHARES,
    "upgrade": _UPGRADE,
    "survey": _SURVEY,
    "claim_plan": _CLAIM_PLAN,
    "plan_done": _PLAN_DONE,
    "claim": _CLAIM,
    "unclaim": _UNCLAIM,
    "renew": _RENEW,
    "complete": _COMPLETE,
    "replan": _REPLAN,
    "fail": _FAIL,
    "pause": _PAUSE,
    "resume": _RESUME,
    "cancel": _CANCEL,
}



def _stored_job(claimed: PlanJob | Lease) -> Job:
    """The typed job of a claimed trial, parsed on first use; JobError if what was stored cannot be read (the
    device loop then fails the trial, not itself)."""
    return job_from_dict(claimed.job_data)


@dataclass(frozen=True)
class PlanJob:
    """A claimed planning job: plan `trial_id`'s `job`, then call `plan_done` with `token`."""

    trial_id: str
    token: str
    lease_s: float
    job_data: dict[str, Any]

    job = functools.cached_property(_stored_job)


@dataclass(frozen=True)
class Lease:
    """A claimed unit of `trial_id`; `units_done` units of it ran before (it names the unit)."""

    trial_id: str
    token: str
    device: str
    lease_s: float
    units_done: int
    remaining_units: int
    unit_s: float
    job_data: dict[str, Any]
    export_dir: str

    job = functools.cached_property(_stored_job)


@dataclass(frozen=True)
class Survey:
    """What a free device sees: trials waiting to be planned, runnable candidates, their units done.

    `alive` is False when the device's loop must end (its worker stopped or started a newer loop). `reap`
    names a trial that ended cancelled or failed: this device (and no other) frees its state on the host.
    Candidates are each team's runnable trials of its highest priority with any, longest first.
    """

    alive: bool
    planning: int
    candidates: list[Candidate]
    units_done: dict[str, int]
    reap: str | None = None
    shares: Shares = dataclasses.field(default_factory=Shares)  # of the teams with work
    planning_elsewhere: bool = False  # another device is planning a trial now
    # The lease a speculative claim made with this survey took (see `complete_then_survey`), for the device's
    # policy to confirm, or to give back with `unclaim_then_claim`.
    claimed: Lease | None = None
    planned: PlanJob | None = None  # the trial a survey with `plan` took to plan (see `survey`)


class ShardQueue:
    """The shard task queue of one host in Redis. All state changes are single Lua scripts (atomic).

    `client` must decode responses (``decode_responses=True``).
    """

    def __init__(self, client: redis.Redis, host_id: str) -> None:
        self.client = client
        self.host_id = host_id
        self.prefix = host_prefix(host_id)
        self._scripts = {name: client.register_script(script.source) for name, script in _SCRIPTS.items()}

    def key(self, name: str) -> str:
        """The full Redis key of `name` (``trials``, ``runnable``, ``trial:<id>``...)."""
        return self.prefix + name

    def _argv(self, name: str, args: Mapping[str, object]) -> list[object]:
        """The ARGV of script `name`: the key prefix, then `args` in the order the script names them."""
        names = _SCRIPTS[name].names
        if args.keys() != set(names):
            raise TypeError(f"script {name!r} takes {', '.join(names)}; got {', '.join(args)}.")
        return [self.prefix, *(args[arg] for arg in names)]

    def _run(self, name: str, **args: object) -> Any:
        return self._run_with(None, name, **args)

    def _run_with(self, also: Callable[[redis.client.Pipeline], None] | None, name: str, **args: object) -> Any:
        """Run a script after the commands `also` queues (telemetry), in one round trip."""
        return self._run_all(also, [(name, args)])[0]

    def _run_all(self, also: Callable[[redis.client.Pipeline], None] | None,
                 calls: list[tuple[str, Mapping[str, object]]]) -> list[Any]:
        """Run scripts (name, arguments by name) one after another after the commands `also` queues, in one
        round trip; return their results.

        By EVALSHA: a pipeline holding a Script object would first ask the server whether the script is
        loaded, a second round trip per unit. Should the server have lost them (restart), each runs alone.
        """
        argvs = [(name, self._argv(name, args)) for name, args in calls]
        commands: list[Sequence[object]] = []
        if also is not None:
            buffer = self.client.pipeline(transaction=False)  # only collects what `also` queues
            also(buffer)
            commands.extend(args for args, _ in buffer.command_stack)
        commands.extend(("EVALSHA", self._scripts[name].sha, 0, *argv) for name, argv in argvs)
        try:
            return self._round_trip(commands)[-len(calls):]
        except redis.exceptions.NoScriptError:  # the Script objects load them; what `also` queued was sent already
            return [self._scripts[name](args=argv) for name, argv in argvs]

    def _round_trip(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Send `commands` on one pooled connection in one round trip and return their replies; an error reply
        is raised once every reply is read, so the connection stays in step for its next user. A connection
        Redis dropped is reconnected and the round trip tried again, by the client's retry policy, as
        redis-py does for its own pipelines.

        Written out rather than through a redis-py pipeline or Script call: a device loop makes one or two
        of these per unit, and those wrappers (their hooks, option handling and reply callbacks) cost about
        a quarter as much again as the round trip itself on a loaded CPU host.
        """
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            replies = connection.retry.call_with_retry(lambda: _send_and_read(connection, commands),
                                                       lambda _: connection.disconnect())
        finally:
            pool.release(connection)
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
        return replies

    # Configuration --------------------------------------------------------------------------------------

    def configure(self, *, lease_s: float | None = None, usage_half_life_s: float | None = None,
                  capacity_bytes: int | None = None) -> None:
        """Set the lease length of this host's units, the half-life of teams' usage and the bytes of the host
        tier that trials' spill stores may take (0: no limit; see admission in `claim_plan`). Each is read at
        every claim and survey, so no restart is needed."""
        for name, value in (("lease_s", lease_s), ("usage_half_life_s", usage_half_life_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value} must be positive.")
        if capacity_bytes is not None:
            if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
                raise ValueError(f"capacity_bytes={capacity_bytes!r} must be a whole number of bytes, 0 or more.")
            self.client.hset(self.key("config"), "capacity_bytes", capacity_bytes)
            self.client.delete(self.key("planning_blocked"))  # the waiting trials may fit now
        if lease_s is not None:
            self.client.hset(self.key("config"), "lease_ms", int(lease_s * 1000))
        if usage_half_life_s is not None:
            self.client.hset(self.key("config"), "half_life_ms", int(usage_half_life_s * 1000))

    def set_quotas(self, quotas: Mapping[str, int], byte_quotas: Mapping[str, int] | None = None) -> None:
        """Set the most trials (`quotas`) and spill-store bytes (`byte_quotas`) each team may have admitted on
        this host at once (planned and not ended; a paused trial keeps its place, as it keeps its spill store).
        A team not named has no such quota; a trial over its team's quota waits to be planned, it never fails
        for it."""
        byte_quotas = byte_quotas or {}
        for name, limits in (("quotas", quotas), ("byte_quotas", byte_quotas)):
            if bad := {team: q for team, q in limits.items() if not isinstance(q, int) or q < 1}:
                raise ValueError(f"{name} must be whole numbers, 1 or more; got {bad}.")
        pipe = self.client.pipeline()
        for name, limits in (("quotas", quotas), ("byte_quotas", byte_quotas)):
            pipe.delete(self.key(name))
            if limits:
                pipe.hset(self.key(name), mapping=dict(limits))
        pipe.delete(self.key("planning_blocked"))  # the waiting trials may be admitted now
        pipe.execute()

    def set_capacity_override(self, capacity_bytes: int | None) -> None:
        """Set (or, with None, drop) the host tier's capacity an administrator chose for this host; it takes
        precedence over what the host's workers found when they started (`configure(capacity_bytes=)`)."""
        if capacity_bytes is not None and (not isinstance(capacity_bytes, int) or capacity_bytes < 0):
            raise ValueError(f"capacity_bytes={capacity_bytes!r} must be a whole number of bytes, 0 or more.")
        pipe = self.client.pipeline()
        if capacity_bytes is None:
            pipe.hdel(self.key("config"), "capacity_override_bytes")
        else:
            pipe.hset(self.key("config"), "capacity_override_bytes", capacity_bytes)
        pipe.delete(self.key("planning_blocked"))  # the waiting trials may fit now
        pipe.execute()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Set the teams' fair-share weights (a team not named weighs 1); they count from the next survey."""
        if bad := {team: w for team, w in weights.items() if not (0 < w < float("inf"))}:
            raise ValueError(f"weights must be positive numbers; got {bad}.")
        pipe = self.client.pipeline()
        pipe.delete(self.key("weights"))
        if weights:
            pipe.hset(self.key("weights"), mapping={team: repr(float(w)) for team, w in weights.items()})
        pipe.execute()

    def advance_clock_for_tests(self, *, seconds: float) -> None:
        """Move this host's queue clock `seconds` forward, for every script from now on: leases expire and
        holds lapse as if that time had passed, without a test sleeping and hoping. Never called in
        production, where the clock is Redis's own."""
        if seconds <= 0:
            raise ValueError(f"seconds={seconds} must be positive: the queue's clock only moves forward.")
        self.client.hincrby(self.key("config"), "clock_offset_ms", int(seconds * 1000))

    # Submitting and controlling trials -----------------------------------------------------------------

    def submit(self, *, trial_id: str, job: Job, export_dir: str, team: str = "", priority: str = "normal",
               host_bytes: int = 0, paused: bool = False) -> None:
        """Add a trial in state planning; a device worker will plan it once it is admitted. `team` shares
        the devices with the other teams by fair share; `priority` (low, normal, high) orders the team's own
        trials; `host_bytes` is what its spill store will take on the host tier (0: unknown, counted as
        nothing), which admission checks against the host's capacity. `paused`: once planned, the trial
        waits paused until resumed (see `resume_all`, for a sweep released at once). Raises TrialExists,
        ValueError."""
        if not isinstance(host_bytes, int) or host_bytes < 0:
            raise ValueError(f"host_bytes={host_bytes!r} must be a whole number of bytes, 0 or more.")
        if not TRIAL_ID_PATTERN.match(trial_id):
            raise ValueError(f"trial id {trial_id!r} must be 1-64 letters, digits, '.', '_' or '-'.")
        if not TEAM_PATTERN.match(team):
            raise ValueError(f"team {team!r} must be at most 64 letters, digits, '.', '_' or '-'.")
        if priority not in PRIORITIES:
            raise ValueError(f"priority {priority!r} must be one of {', '.join(PRIORITIES)}.")
        if self._run("submit", id=trial_id, job=json.dumps(job.to_dict()), export_dir=export_dir, team=team,
                     priority=PRIORITIES[priority], host_bytes=host_bytes, paused="1" if paused else "0") == "exists":
            raise TrialExists(f"trial {trial_id!r} already exists on host {self.host_id!r}.")

    def pause(self, trial_id: str) -> str:
        """Pause now if runnable, else when its unit in flight ends. Returns the state now."""
        return self._control("pause", trial_id)

    def resume(self, trial_id: str) -> str:
        """Make a paused trial runnable again (or drop a pending pause). Returns the state now."""
        return self._control("resume", trial_id)

    def cancel(self, trial_id: str) -> str:
        """Cancel now if not in flight, else when its unit ends. Returns the state now."""
        return self._control("cancel", trial_id)

    def resume_all(self, trial_ids: Sequence[str]) -> list[str]:
        """`resume` each of `trial_ids`, in one round trip: a sweep held back as a whole goes to the devices at
        once. Their states; raises as `resume` does for the first that could not be resumed (the others are
        resumed all the same)."""
        outcomes: list[str] = self._run_all(None, [("resume", {"id": trial_id}) for trial_id in trial_ids])
        return [self._checked("resume", trial_id, outcome) for trial_id, outcome in zip(trial_ids, outcomes,
                                                                                       strict=True)]

    def _control(self, action: str, trial_id: str) -> str:
        return self._checked(action, trial_id, self._run(action, id=trial_id))

    def _checked(self, action: str, trial_id: str, outcome: str) -> str:
        """A control script's outcome, or the error it stands for."""
        if outcome == "missing":
            raise TrialNotFound(f"trial {trial_id!r} does not exist on host {self.host_id!r}.")
        if outcome.startswith("invalid:"):
            state = outcome.removeprefix("invalid:")
            raise InvalidTransition(f"cannot {action} trial {trial_id!r}: it is {state}.")
        return outcome

    # What device workers do ---------------------------------------------------------------------------

    def device_start(self, device: str, epoch: str) -> None:
        """Make `epoch` the device's current loop; loops of older epochs end at their next survey."""
        self.client.hset(self.key(f"device:{device}"), mapping={"epoch": epoch, "stop": "0"})

    def device_stop(self, device: str) -> None:
        """Ask the device's loop to end at its next unit boundary (the worker is shutting down)."""
        self.client.hset(self.key(f"device:{device}"), "stop", "1")

    def register_host(self) -> None:
        """Say that this host has device workers (they call it when they start), so the web app places trials
        on it (`worker.scheduling.placement`)."""
        self._run("upgrade")
        seconds, micros = self.client.time()
        self.client.zadd(HOSTS_KEY, {self.host_id: seconds * 1000 + micros // 1000})

    def load(self, *, live_within_s: float = 60.0) -> HostLoad:
        """What this host holds, for placement: devices seen within `live_within_s`, the host tier's capacity
        and what admitted trials take of it, and its trials with work."""
        seconds, micros = self.client.time()
        now = seconds + micros / 1e6
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.key("config"), ["capacity_override_bytes", "capacity_bytes"])
        pipe.get(self.key("admitted_bytes"))
        pipe.hvals(self.key("team_work"))
        pipe.llen(self.key("planning"))
        (override, found), admitted, working, planning = pipe.execute()
        capacity = override if override is not None else found
        live = sum(1 for fields in self.devices().values()
                   if fields.get("stop") != "1" and now - float(fields.get("seen") or 0) <= live_within_s)
        return HostLoad(host_id=self.host_id, live_devices=live, capacity_bytes=int(capacity or 0),
                        admitted_bytes=int(admitted or 0), trials=sum(int(n) for n in working) + int(planning))

    def shares(self) -> Shares:
        """The fair-share standing of the teams with work now: decayed usage, weight, last service."""
        raw = self._run("shares")
        return _shares_from(raw[1:], int(raw[0]))

    def devices(self) -> dict[str, dict[str, str]]:
        """Every device that ever ran a loop on this host: name -> epoch, stop, seen."""
        prefix = self.key("device:")
        return {
            key.removeprefix(prefix): self.client.hgetall(key)
            for key in sorted(self.client.scan_iter(match=prefix + "*", count=1000))
        }

    def survey(self, device: str, epoch: str, *, holding: BaseShard | None = None, plan: bool = False) -> Survey:
        """Requeue expired leases, then list trials to plan and the candidates the policy picks from:
        the trials `device` holds, each team's longest, and those it has affinity with (its last device,
        or base layers overlapping `holding`, the shared base layers the device holds now).

        A device loop calls it before each claim; the returned `alive` tells it whether to go on. With
        `plan`, a device that is to plan next (trials wait to be planned and no other device plans them)
        takes one in the same script, as `claim_plan` would (`Survey.planned`).
        """
        return _survey_from(self._run("survey", **_survey_args(device, epoch, holding, plan=plan)), device)

    def claim_plan(self, device: str, *, idle: bool = True) -> PlanJob | None:
        """Take a trial waiting to be planned that can be admitted, with a lease; None when there is none,
        or when the device is not `idle` (it has units it could run) and another device is planning: then it
        trains, so that many trials waiting to be planned take one device at a time from training.

        Admission: the trial's team is under its quota (`set_quotas`) and the host tier has room for its
        `host_bytes` (`configure(capacity_bytes=)`). Of the admissible trials, the team whose turn it is by
        fair share goes first, its oldest trial first. The others wait, their record's message saying why.
        """
        return _plan_job_from(self._run("claim_plan", device=device, idle="1" if idle else "0"))

    def plan_done(
        self, job: PlanJob, *, remaining_units: int, unit_s: float, plan: Mapping[str, Any], units_done: int = 0,
        also: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> str:
        """Record a trial's plan and first estimate; it becomes runnable (or paused/cancelled if asked).

        `units_done` > 0 says the trial's state already holds that many units (it resumes from its store).
        `also` queues commands to send in the same round trip (telemetry). Raises LeaseLost.
        """
        outcome: str = self._run_with(
            also, "plan_done", id=job.trial_id, token=job.token, remaining_units=remaining_units,
            unit_s=repr(unit_s), plan=json.dumps(dict(plan)), units_done=int(units_done),
        )
        return self._check_lease(outcome, job.trial_id)

    def claim(self, trial_id: str, device: str) -> Lease | None:
        """Claim the next unit of `trial_id` for `device`; None if another device took it first."""
        return self.claim_first([trial_id], device)

    def claim_first(self, trial_ids: Sequence[str], device: str) -> Lease | None:
        """Claim the next unit of the first of `trial_ids` (the policy's choices, best first) that is still
        runnable, in one round trip; None if other devices took them all. Devices that surveyed at the same
        moment see the same best trial: the one that comes second takes the next best at once, rather than
        surveying again."""
        if not trial_ids:
            raise ValueError("claim needs trial ids; got none")
        return _lease_from(self._run("claim", ids=_claim_ids(trial_ids), device=device), device)

    def unclaim_then_claim(self, claimed: Lease, trial_ids: Sequence[str]) -> Lease | None:
        """Give back a speculative claim the policy did not confirm (the trial goes back as it was, see
        `_UNCLAIM`), then `claim_first` of `trial_ids` (none: only give it back), in one round trip."""
        calls: list[tuple[str, Mapping[str, object]]] = [("unclaim", {"id": claimed.trial_id, "token": claimed.token})]
        if trial_ids:
            calls.append(("claim", {"ids": _claim_ids(trial_ids), "device": claimed.device}))
        replies = self._run_all(None, calls)
        return _lease_from(replies[1], claimed.device) if trial_ids else None

    def renew(self, trial_id: str, token: str) -> bool:
        """Extend a lease by the host's lease length; False when it was already lost."""
        return bool(self._run("renew", id=trial_id, token=token))

    def complete(
        self, lease: Lease, *, remaining_units: int, unit_s: float, message: str = "",
        steps_done: int | None = None, hold_s: float = 0.0, next_base: BaseShard | None = None,
        pruned: bool = False, rung: int | None = None, also: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> str:
        """End a unit: the trial finishes (0 units left), or becomes runnable, paused or cancelled.

        `unit_s` is the trial's new unit-time estimate; `message` and `steps_done` (the training steps the
        trial has taken, so a reader of the events need not wait for its metrics) go with the finished
        event. `hold_s` > 0 says this device keeps activations of the trial for that long (surveys report
        it as `held_by`). `next_base`: the shared base layers the trial's next unit reads (surveys report
        it, for the policy's base affinity). `pruned`: with 0 units left, the experiment's pruner stopped
        the trial (it ends 'pruned', not 'finished'), and `rung` is the pruner's rung it reached (both go
        with the ended event). `also` queues commands to send in the same round trip (telemetry). Raises
        LeaseLost when the lease expired meanwhile (the unit is being re-run elsewhere).
        """
        args = _complete_args(lease, remaining_units, unit_s, message, steps_done, hold_s, epoch="",
                              next_base=next_base, pruned=pruned, rung=rung)
        outcome: str = self._run_with(also, "complete", **args)
        return self._check_lease(outcome, lease.trial_id)

    def complete_then_survey(
        self, lease: Lease, epoch: str, *, remaining_units: int, unit_s: float, message: str = "",
        steps_done: int | None = None, hold_s: float = 0.0, next_base: BaseShard | None = None,
        holding: BaseShard | None = None, pruned: bool = False, rung: int | None = None,
        claim: Sequence[str] = (), plan: bool = False, also: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> tuple[str, Survey, Lease | None]:
        """`complete`, then `survey` for the same device, in one round trip: what a device loop does between
        two units. Returns the trial's state, the survey, and the lease on the trial's next unit if this
        device holds the trial (`hold_s` > 0) and goes on with it: then the trial stays running (no claim
        is needed; the policy picks a held trial first anyway), unless a pause or cancel is pending, a trial
        waits to be planned and no other device is planning, or the device's loop `epoch` is no longer
        current. `holding`: the shared base layers the unit read, which the device holds after it (for the
        survey).

        `claim`: the device's guess of what its policy will choose from the survey, best first (see
        `policy.ranked`). The survey's script then also claims the first of them still runnable, unless the
        loop must end or the device is to plan next, and the survey carries that lease (`Survey.claimed`):
        when the policy does choose it, the unit needs no round trip of its own to claim; otherwise the device
        gives it back with `unclaim_then_claim`, in the round trip the claim would have taken anyway. `plan`:
        see `survey` (a device to plan next claims no unit).

        Raises LeaseLost when the unit's lease was lost; the survey, made all the same, goes with it
        (``LeaseLost.survey``), with what it claimed."""
        outcome, raw = self._run_all(also, [
            ("complete", _complete_args(lease, remaining_units, unit_s, message, steps_done, hold_s, epoch=epoch,
                                        next_base=next_base, pruned=pruned, rung=rung)),
            ("survey", _survey_args(lease.device, epoch, holding, claim, plan)),
        ])
        survey = _survey_from(raw, lease.device)
        if isinstance(outcome, list):
            token, lease_ms = outcome
            after = dataclasses.replace(lease, token=token, lease_s=int(lease_ms) / 1000,
                                        units_done=lease.units_done + 1, remaining_units=remaining_units,
                                        unit_s=unit_s)
            return "running", survey, after
        try:
            return self._check_lease(outcome, lease.trial_id), survey, None
        except LeaseLost as lost:
            lost.survey = survey
            raise

    def replan(
        self, lease: Lease, *, remaining_units: int, unit_s: float, plan: Mapping[str, Any], message: str,
        also: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> str:
        """End a unit that did not complete because its trial was re-planned (out of device memory): the
        trial takes `plan` and its new unit count and becomes runnable again (or paused/cancelled if asked),
        with `message` on its event. Raises LeaseLost."""
        outcome: str = self._run_with(
            also, "replan", id=lease.trial_id, token=lease.token, remaining_units=remaining_units,
            unit_s=repr(unit_s), plan=json.dumps(dict(plan)), device=lease.device, message=message,
        )
        return self._check_lease(outcome, lease.trial_id)

    def fail(self, trial_id: str, token: str, message: str) -> str:
        """Fail a trial whose unit (or planning) raised, keeping `message` for the UI."""
        return self._check_lease(self._run("fail", id=trial_id, token=token, message=message), trial_id)

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until something may have become claimable, or `timeout_s` passes."""
        self.client.blpop([self.key("wake")], timeout=timeout_s)

    def _check_lease(self, outcome: str, trial_id: str) -> str:
        if outcome == "lost":
            raise LeaseLost(f"the lease on trial {trial_id!r} expired; another device re-runs its unit.")
        return outcome

    # Reading -----------------------------------------------------------------------------------------

    def trial(self, trial_id: str) -> TrialRecord:
        """The trial's state as plain data. Raises TrialNotFound."""
        fields = self.client.hgetall(self.key(f"trial:{trial_id}"))
        if not fields:
            raise TrialNotFound(f"trial {trial_id!r} does not exist on host {self.host_id!r}.")
        return _record(trial_id, fields, bool(self.client.hexists(self.key("admitted"), trial_id)))

    def trials(self) -> list[TrialRecord]:
        """Every trial of this host, oldest first."""
        ids = self.client.zrange(self.key("trials"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        pipe.hkeys(self.key("admitted"))
        for trial_id in ids:
            pipe.hgetall(self.key(f"trial:{trial_id}"))
        admitted, *rows = pipe.execute()
        return [_record(trial_id, fields, trial_id in set(admitted))
                for trial_id, fields in zip(ids, rows, strict=True) if fields]

    def states(self) -> dict[str, str]:
        """Every trial of this host -> its state, oldest first; `trials` without the jobs and plans."""
        ids = self.client.zrange(self.key("trials"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for trial_id in ids:
            pipe.hget(self.key(f"trial:{trial_id}"), "state")
        return {trial_id: state for trial_id, state in zip(ids, pipe.execute(), strict=True) if state is not None}


def _record(trial_id: str, fields: Mapping[str, str], admitted: bool = False) -> TrialRecord:
    remaining_units = int(fields["remaining_units"]) if "remaining_units" in fields else None
    unit_s = float(fields["unit_s"]) if "unit_s" in fields else None
    return TrialRecord(
        trial_id=trial_id,
        state=fields.get("state", ""),
        message=fields.get("message", ""),
        control=fields.get("control", ""),
        device=fields.get("device", ""),
        last_device=fields.get("last_device", ""),
        remaining_units=remaining_units,
        unit_s=unit_s,
        remaining_s=(
            remaining_seconds(remaining_units, unit_s)
            if remaining_units is not None and unit_s is not None
            else None
        ),
        units_done=int(fields.get("units_done", 0)),
        requeues=int(fields.get("requeues", 0)),
        replans=int(fields.get("replans", 0)),
        submitted=float(fields.get("submitted", 0)),
        updated=float(fields.get("updated", 0)),
        export_dir=fields.get("export_dir", ""),
        job=json.loads(fields.get("job", "{}")),
        plan=json.loads(fields["plan"]) if "plan" in fields else None,
        team=fields.get("team", ""),
        priority=int(fields.get("priority", 1)),
        host_bytes=int(fields.get("host_bytes", 0)),
        admitted=admitted,
    )


def _send_and_read(connection: redis.connection.AbstractConnection, commands: Sequence[Sequence[object]]) -> list[Any]:
    """Send `commands` at once, then read a reply for each; an error reply takes its place in the list."""
    connection.send_packed_command(_pack(connection, commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except redis.ResponseError as reply:
            replies.append(reply)
    return replies


def _pack(connection: redis.connection.AbstractConnection, commands: Sequence[Sequence[object]]) -> list[bytes]:
    """`commands` in the Redis protocol, as chunks to send: by hiredis itself where it is installed (redis-py's
    own packing, which calls it, adds checks this queue's arguments never need, a tenth of a round trip's
    client time), else by the connection."""
    if hiredis is None:
        return connection.pack_commands(commands)
    return [b"".join(hiredis.pack_command(tuple(command)) for command in commands)]


def _claim_ids(trial_ids: Sequence[str]) -> str:
    """Trial ids as a claim script takes them, separated by spaces."""
    if any(not TRIAL_ID_PATTERN.match(t) for t in trial_ids):
        raise ValueError(f"claim needs trial ids; got {list(trial_ids)!r}")
    return " ".join(trial_ids)


def _lease_from(raw: list[Any] | None, device: str) -> Lease | None:
    """The lease a claim returns (``id, token, lease_ms, units_done, job, export_dir, remaining_units,
    unit_s``), or None for none."""
    if raw is None:
        return None
    trial_id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s = raw
    return Lease(trial_id=trial_id, token=token, device=device, lease_s=int(lease_ms) / 1000,
                 units_done=int(units_done), remaining_units=int(remaining_units), unit_s=float(unit_s),
                 job_data=json.loads(job), export_dir=export_dir)


def _plan_job_from(raw: list[Any] | None) -> PlanJob | None:
    """The job a claim of a trial to plan returns (``id, token, lease_ms, job``), or None for none."""
    if raw is None:
        return None
    trial_id, token, lease_ms, job = raw
    return PlanJob(trial_id, token, int(lease_ms) / 1000, json.loads(job))


def _survey_from(reply: list[Any], device: str) -> Survey:
    """The one reader of what the survey script returns: the survey, a flat array (see `_SURVEY`), ``[0]`` when
    the device's loop must end, else ``[1, planning, elsewhere, reap, teams]``, four entries per team with
    work (``team, usage, weight, served``) and eight per candidate: ``id, remaining_s, last_device,
    units_done, held_by, next_base, team, priority`` ('' for no trial to reap, no last device, no holder, no
    base layers, never served); then the lease its speculative claim took for `device`, and the trial it
    took to plan, or nil for each.
    """
    raw, claimed, planned = reply
    if not raw[0]:
        return Survey(alive=False, planning=0, candidates=[], units_done={})
    _, planning, elsewhere, reap, teams, *flat = raw
    shares = _shares_from(flat, int(teams))
    candidates, units_done = [], {}
    for i in range(4 * int(teams), len(flat), 8):
        trial_id, score, last_device, done, held_by, next_base, team, priority = flat[i : i + 8]
        candidates.append(Candidate(trial_id, float(score), last_device or None, held_by or None,
                                    BaseShard.parse(next_base), team, int(priority)))
        units_done[trial_id] = int(done)
    return Survey(alive=True, planning=int(planning), candidates=candidates, units_done=units_done,
                  reap=reap or None, shares=shares, planning_elsewhere=bool(int(elsewhere)),
                  claimed=_lease_from(claimed, device), planned=_plan_job_from(planned))


def _shares_from(flat: list[Any], teams: int) -> Shares:
    """Fair-share standing from four entries per team: team, usage, weight, served ('' if never)."""
    shares = Shares()
    for i in range(0, 4 * teams, 4):
        team, usage, weight, served = flat[i : i + 4]
        shares.usage[team], shares.weights[team] = float(usage), float(weight)
        if served:
            shares.served[team] = float(served)
    return shares


def _survey_args(device: str, epoch: str, holding: BaseShard | None = None, claim: Sequence[str] = (),
                 plan: bool = False) -> dict[str, object]:
    """The survey script's arguments for the loop `epoch` of `device`, which holds base layers `holding`,
    claiming the first still runnable of `claim` (none when empty), or with `plan` a trial to plan."""
    return {"head": SURVEY_HEAD, "base_walk": SURVEY_BASE_WALK, "device": device, "epoch": epoch,
            "holding": "" if holding is None else str(holding), "claim": _claim_ids(claim),
            "plan": "1" if plan else "0"}


def _complete_args(
    lease: Lease, remaining_units: int, unit_s: float, message: str, steps_done: int | None, hold_s: float, *,
    epoch: str, next_base: BaseShard | None = None, pruned: bool = False, rung: int | None = None,
) -> dict[str, object]:
    """The complete script's arguments; `epoch` is the device loop's that goes on with a held trial, or ''."""
    return {"id": lease.trial_id, "token": lease.token, "remaining_units": remaining_units,
            "unit_s": repr(unit_s), "device": lease.device, "message": message,
            "steps_done": "" if steps_done is None else int(steps_done), "hold_ms": int(hold_s * 1000),
            "epoch": epoch, "next_base": "" if next_base is None else str(next_base),
            "ended": "pruned" if pruned else "finished", "rung": "" if rung is None else int(rung)}
