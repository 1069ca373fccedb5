-- The prelude of every script of the shard queue: key names, the clock, leases, fair share, admission, the
-- runnable sets and the state-change event. `worker.scheduling.queue.scripts` puts it before each script's
-- body with the script's arguments named as locals; ${...} stands for one of its CONSTANTS.
-- ARGV[1] is the host's key prefix (`worker.scheduling.keys` lists every key); ARGV[2] the time the queue's
-- clock gives (ms), or '' for Redis's own clock.
local P = ARGV[1]
local function key(name) return P .. name end
local function tkey(id) return P .. 'trial:' .. id end
-- The units of a trial leased now: token -> '<lane> <device>' (lane 'plan' for its planning). A trial runs one
-- unit at a time, or, widened onto idle devices, one unit per lane of a wavefront (worker.engine.schedule).
local function lkey(id) return P .. 'trial:' .. id .. ':leases' end
-- The host's settings a script uses are read once, on first use (a script runs many times per unit).
local CONFIG
local function config()
  if not CONFIG then
    local c = redis.call('HMGET', key('config'), 'lease_ms', 'half_life_ms')
    CONFIG = {lease = tonumber(c[1] or '${DEFAULT_LEASE_MS}'), half_life = tonumber(c[2] or '${HALF_LIFE_MS}')}
  end
  return CONFIG
end
-- One reading of the clock per script (a script is atomic): Redis's, so that hosts with skewed clocks agree on
-- lease expiry, unless the queue was given a clock of its own.
local NOW = tonumber(ARGV[2])
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end
local function lease_ms()
  return config().lease
end
-- Lease `lane` of `id` (or 'plan', its planning) to `device` for the host's lease length: a new token, kept in
-- the trial's leases, and the expiry in the leases set ('<id> <token>'). Returns the token and the lease length
-- (ms).
-- Tokens fence the spill store, which keeps the largest it saw, so they must grow even across a Redis that
-- lost its data (emptied, or restarted from an append-only file a second behind): no token is below the
-- clock's milliseconds times 1000, which exceeds every token granted before (at most 1000 a millisecond).
local function grant_lease(id, device, lane)
  local seq = redis.call('INCR', key('seq'))
  local floor = now_ms() * 1000
  if seq < floor then
    seq = floor
    redis.call('SET', key('seq'), string.format('%d', floor))
  end
  local token = string.format('%d', seq)
  local ms = lease_ms()
  redis.call('HSET', lkey(id), token, lane .. ' ' .. device)
  redis.call('HSET', tkey(id), 'device', device)
  redis.call('ZADD', key('leases'), now_ms() + ms, id .. ' ' .. token)
  return token, ms
end
-- The lanes of `id` leased now (a set), and how many units are in flight.
local function lanes_in_flight(id)
  local flying, n = {}, 0
  for _, held in ipairs(redis.call('HVALS', lkey(id))) do
    flying[string.match(held, '^(%S+)')] = true
    n = n + 1
  end
  return flying, n
end
-- The first lane whose next unit can run (the engine's last report, `ready`) and that no unit in flight holds,
-- nor, for `device` (nil: any device), another device's kept activations (`held_lane` of `last_device` until
-- `held_until`); nil when none.
local function free_lane(id, device)
  local t = redis.call('HMGET', tkey(id), 'ready', 'held_lane', 'last_device', 'held_until')
  local flying = lanes_in_flight(id)
  local held = (device and tonumber(t[4] or '0') > now_ms() and t[3] ~= device) and t[2] or nil
  for lane in string.gmatch(t[1] or '0', '%S+') do
    if not flying[lane] and lane ~= held then return lane end
  end
  return nil
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
-- Wake a device waiting for work (ShardQueue.wait_for_work): something may have become claimable.
local function wake()
  if redis.call('LPUSH', key('wake'), '1') > 64 then redis.call('LTRIM', key('wake'), 0, 63) end
end
-- The widening sets: per team and priority, the running trials that may take another device now (a lane ready
-- and free, fewer units in flight than its admitted width, no pause or cancel waiting), scored as the runnable
-- sets. A device takes one only when no trial without a unit in flight has one for it (policy.pick). A trial
-- entering them wakes an idle device: a lane of a running trial frees up while the idle devices wait, and a
-- trial becoming runnable (the only other wake) happens when its lanes end, when no second lane is ready yet.
local function widen_key(id)
  local t = redis.call('HMGET', tkey(id), 'team', 'priority')
  return key('widen:' .. (t[1] or '') .. ':' .. (t[2] or '1'))
end
local function widen_update(id)
  local t = redis.call('HMGET', tkey(id), 'state', 'control', 'width', 'remaining_units', 'unit_s')
  local _, n = lanes_in_flight(id)
  if t[1] == 'running' and not t[2] and n > 0 and n < tonumber(t[3] or '1') and free_lane(id, nil) then
    if redis.call('ZADD', widen_key(id), -(tonumber(t[4] or '0') * tonumber(t[5] or '0')), id) == 1 then wake() end
  else
    redis.call('ZREM', widen_key(id), id)
  end
end
-- The bytes of the host tier trials' stores may take (0: no limit): what an administrator set for the host,
-- else what its workers found when they started.
local function capacity_of_host()
  local c = redis.call('HMGET', key('config'), 'capacity_override_bytes', 'capacity_bytes')
  return tonumber(c[1] or c[2] or '0')
end
-- Admission: a trial may make its spill store (be planned) once its team is under its quotas (trials and
-- bytes admitted at once) and the host tier has room for its bytes; it stays admitted, its store on the
-- host, until it ends. Returns true, or false and why it waits. (It is admitted as wide as the room allows:
-- see admit.)
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
    local t = redis.call('HMGET', tkey(id), 'state', 'device')
    if t[1] ~= 'planning' or t[2] ~= other or redis.call('EXISTS', lkey(id)) == 0 then
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
-- Admit an admissible trial, as wide as the host tier and its team's byte quota have room for: each micro-batch
-- it runs at once beyond the first keeps `lane_bytes` more in its store (its boundaries), up to `width_cap`
-- (its micro-batches, and its experiment's most devices per trial). A trial admitted narrow stays narrow.
local function admit(id)
  if redis.call('HEXISTS', key('admitted'), id) == 1 then return end
  local t = redis.call('HMGET', tkey(id), 'team', 'host_bytes', 'lane_bytes', 'width_cap')
  local team, bytes, lane = t[1] or '', tonumber(t[2] or '0'), tonumber(t[3] or '0')
  local capacity, used = capacity_of_host(), tonumber(redis.call('GET', key('admitted_bytes')) or '0')
  local byte_quota = tonumber(redis.call('HGET', key('byte_quotas'), team) or '0')
  local team_bytes = tonumber(redis.call('HGET', key('team_bytes'), team) or '0')
  local width = 1
  while width < tonumber(t[4] or '1') do
    local more = bytes + width * lane
    if (capacity > 0 and used + more > capacity) or (byte_quota > 0 and team_bytes + more > byte_quota) then break end
    width = width + 1
  end
  bytes = bytes + (width - 1) * lane
  redis.call('HSET', tkey(id), 'width', width)
  redis.call('HSET', key('admitted'), id, string.format('%d', bytes))
  redis.call('INCRBY', key('admitted_bytes'), string.format('%d', bytes))
  redis.call('HINCRBY', key('team_admitted'), team, 1)
  redis.call('HINCRBY', key('team_bytes'), team, string.format('%d', bytes))
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
  if state == 'finished' or state == 'pruned' or state == 'cancelled' or state == 'failed' then
    unadmit(id)
    -- No unit of it commits any more: what other lanes still run is refused (the trial's leases go with it).
    for _, token in ipairs(redis.call('HKEYS', lkey(id))) do redis.call('ZREM', key('leases'), id .. ' ' .. token) end
    redis.call('DEL', lkey(id))
  end
  if state ~= 'running' then redis.call('ZREM', widen_key(id), id) end
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
  redis.call('XADD', key('events'), 'MAXLEN', '~', ${EVENTS_MAXLEN}, '*', unpack(fields))
  if state == 'running' then redis.call('HSET', tkey(id), 'active', '1')
  else redis.call('HDEL', tkey(id), 'active') end
end
local function make_runnable(id, quiet, message)
  local remaining = redis.call('HMGET', tkey(id), 'remaining_units', 'unit_s')
  runnable_add(id, -(tonumber(remaining[1]) * tonumber(remaining[2])))
  set_state(id, 'runnable', message, quiet)
  wake()
end
-- End a lease: 'ok' and its lane, or 'lost' when the token is no longer the trial's (it expired and was
-- requeued, or the trial ended).
local function release(id, token)
  local held = redis.call('HGET', lkey(id), token)
  if not held then return 'lost' end
  redis.call('HDEL', lkey(id), token)
  redis.call('ZREM', key('leases'), id .. ' ' .. token)
  return 'ok', string.match(held, '^(%S+)')
end
-- Drop every other unit of `id` in flight (a re-plan, or a failure: what they would commit is refused).
local function release_all(id)
  for _, token in ipairs(redis.call('HKEYS', lkey(id))) do redis.call('ZREM', key('leases'), id .. ' ' .. token) end
  redis.call('DEL', lkey(id))
end
-- The token of the lease of `lane` that expired last (its unit may have committed unreported: the next unit of
-- the lane reports it first), taken off the trial; '' when none.
local function take_expired(id, lane)
  local pairs_ = redis.call('HGET', tkey(id), 'expired') or ''
  local found, rest = '', {}
  for item in string.gmatch(pairs_, '%S+') do
    local l, token = string.match(item, '^([^=]+)=(.+)$')
    if l == lane then found = token else rest[#rest + 1] = item end
  end
  if #rest > 0 then redis.call('HSET', tkey(id), 'expired', table.concat(rest, ' '))
  else redis.call('HDEL', tkey(id), 'expired') end
  return found
end
local function note_expired(id, lane, token)
  take_expired(id, lane)
  local before = redis.call('HGET', tkey(id), 'expired')
  redis.call('HSET', tkey(id), 'expired', (before and (before .. ' ') or '') .. lane .. '=' .. token)
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
-- Lease the next unit of the first of `ids` (trial ids separated by spaces, best first) that is runnable, or
-- that is running and may take another device (a free lane: see widen_update):
-- {id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s, lane, expired} (expired: the
-- token of the lane's lease that expired last, or ''), or false when none is. `before(id, wide)`, if given,
-- runs once the trial is out of the runnable (or widening) sets and before the lease changes it.
local function claim_first(ids, device, before)
  for id in string.gmatch(ids, '%S+') do
    local ok, wide = runnable_remove(id) == 1, false
    if not ok and redis.call('ZSCORE', widen_key(id), id) and free_lane(id, device) then ok, wide = true, true end
    if ok then
      local lane = free_lane(id, device) or string.match(redis.call('HGET', tkey(id), 'ready') or '', '%S+') or '0'
      if before then before(id, wide) end
      local active = redis.call('HGET', tkey(id), 'active')
      local token, ms = grant_lease(id, device, lane)
      charge(id)
      if not wide then set_state(id, 'running', nil, active == '1') end
      widen_update(id)
      local u = redis.call('HMGET', tkey(id), 'units_done', 'job', 'export_dir', 'remaining_units', 'unit_s')
      return {id, token, ms, u[1], u[2], u[3], u[4], u[5], lane, take_expired(id, lane)}
    end
  end
  return false
end
-- Take a trial waiting to be planned, with a lease: {id, token, lease_ms, job}, or false when none waits, or
-- when the device is not `idle` (it has units to run) and another device is planning: planning takes one
-- device at a time from training. Of the oldest ${PLANNING_SCAN} trials waiting to be planned, the admissible
-- ones (see admissible) go in fair-share order of their teams, the oldest first within a team; the others
-- keep waiting, with the reason in their message. A trial whose state alone exceeds the host tier fails,
-- saying so.
local function claim_plan(device, idle)
  if not idle and planning_elsewhere(device) then return false end
  local waiting = redis.call('LRANGE', key('planning'), -${PLANNING_SCAN}, -1)
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
  local token, ms = grant_lease(best, device, 'plan')
  redis.call('HSET', key('planners'), device, best)
  return {best, token, ms, redis.call('HGET', tkey(best), 'job')}
end
-- Append the fair-share standing of the teams with work to `out`: their count, then per team its name, usage,
-- weight and when it was last served (ms, '' if never).
local function shares_into(out)
  local teams = redis.call('SMEMBERS', key('teams'))
  table.insert(out, #teams)
  for _, team in ipairs(teams) do
    table.insert(out, team)
    table.insert(out, tostring(usage_of(team)))
    table.insert(out, tostring(weight_of(team)))
    table.insert(out, redis.call('HGET', key('served'), team) or '')
  end
  return teams
end
