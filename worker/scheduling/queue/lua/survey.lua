-- args: head base_walk device epoch holding claim plan
-- include: speculative_claim
-- Check that the calling device loop is still the device's current one (its worker did not restart or
-- stop), requeue expired leases, then report how many trials wait to be planned, one ended trial whose
-- state the caller must free, and the candidates the policy needs to decide as it would over every runnable
-- trial, each with its last device, units done and the device holding its activations (its last device,
-- until held_until). What it reads does not grow with the runnable trials:
-- - the trials this device holds (`held:<device>`, of any team): the policy runs one of them first;
-- - per team with work, in its highest priority with runnable trials: the head of its set, up to `head`
--   trials no other device holds (held ones go out too, marked, but there are at most as many as devices);
-- - and, of those within the tie tolerance of the longest, the affinity views: the longest whose last unit
--   ran on this device, and the longest (of the first `base_walk`) whose next unit reads base layers that
--   overlap `holding`, the layers the device holds (policy.BaseShard's text, or '').
-- Returns {survey, claimed, planned}. With `plan` '1', a device that is to plan next (trials wait to be
-- planned and no other device plans) takes one here (see claim_plan) and `planned` is that job. Else `claim`
-- names trials (best first, or ''), the device's guess of what its policy will choose from this survey: the
-- script claims the first of them still runnable (see claim_speculatively) and `claimed` is that lease.
-- Both are false when not taken, and when the loop must end.
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
for _, member in ipairs(expired) do
  redis.call('ZREM', key('leases'), member)
  local id, token = string.match(member, '^(%S+) (%S+)$')
  local held = id and redis.call('HGET', lkey(id), token)
  if not id and redis.call('HGET', tkey(member), 'state') == 'running' then
    -- a lease granted before trials could run on several devices: the trial's one unit runs again
    redis.call('HDEL', tkey(member), 'lease', 'held_until')
    after_unit(member, false, 'lease expired; the unit runs again')
  elseif held then
    redis.call('HDEL', lkey(id), token)
    redis.call('HDEL', tkey(id), 'held_until')
    redis.call('HINCRBY', tkey(id), 'requeues', 1)
    local lane, device = string.match(held, '^(%S+) (%S+)$')
    -- The unit may have committed before its device went silent: the lane's next lease reports it first.
    if lane ~= 'plan' then note_expired(id, lane, token) end
    local state = redis.call('HGET', tkey(id), 'state')
    local _, in_flight = lanes_in_flight(id)
    if in_flight > 0 then
      widen_update(id)
    elseif state == 'planning' then
      planning_add(id, true)
      wake()
    elseif state == 'running' then
      after_unit(id, false, 'lease of ' .. device .. ' expired; the unit runs again')
    end
  end
end
-- Else {1, planning, elsewhere, reap, teams, then per team with work: team, usage, weight, served (ms, '' if
-- never), then per candidate: id, remaining_s, last_device, units_done, held_by, next_base, team, priority,
-- wide}:
-- planning counts the trials waiting to be planned, elsewhere is 1 when another device is planning one (a
-- device with units to run then runs them, without asking to plan); '' stands for no trial to reap, no last
-- device, no holder, no base layers read by the next unit. `wide` is 1 for a trial that runs already and may
-- take this device too (a lane of its wavefront; see widen_update), else 0.
local planning = plannable()
local out = {1, planning, (planning > 0 and planning_elsewhere(device)) and 1 or 0,
             redis.call('RPOP', key('reap')) or ''}
local teams = shares_into(out)
local seen = {}
-- Add a candidate once, from its runnable set's score (minus its remaining seconds); returns its remaining
-- seconds and its holder ('' when none).
local function candidate(id, score, team, priority, wide)
  local remaining = tonumber(score)
  remaining = remaining == 0 and 0 or -remaining
  local extra = redis.call('HMGET', tkey(id), 'last_device', 'units_done', 'held_until', 'next_base')
  local held_by = (tonumber(extra[3] or '0') > now_ms()) and extra[1] or ''
  if not seen[id] then
    seen[id] = true
    for _, value in ipairs({id, string.format('%.17g', remaining), extra[1] or '', extra[2] or '0', held_by,
                            extra[4] or '', team, priority, wide and 1 or 0}) do
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
  else  -- running on other devices too: its held lane may be this device's next unit
    local priority = t[5] or '1'
    local score = redis.call('ZSCORE', key('widen:' .. (t[4] or '') .. ':' .. priority), id)
    if score then candidate(id, score, t[4] or '', priority, true) end
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
      local floor = longest * (1 - ${TIE_TOLERANCE})
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
-- Per team with work, the longest of the running trials of its highest priority with any that may take this
-- device too (a lane of their wavefronts): the policy gives a device to one only when no trial without a unit
-- in flight can run on it.
for _, team in ipairs(teams) do
  for priority = 2, 0, -1 do
    local wide = redis.call('ZRANGE', key('widen:' .. team .. ':' .. priority), 0, head - 1, 'WITHSCORES')
    for i = 1, #wide, 2 do candidate(wide[i], wide[i + 1], team, priority, true) end
    if #wide > 0 then break end
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
if not planned and claim ~= '' and (out[2] == 0 or out[3] == 1) then claimed = claim_speculatively(claim, device) end
return {out, claimed, planned}
