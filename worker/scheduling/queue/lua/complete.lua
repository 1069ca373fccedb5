-- args: id token remaining_units unit_s device message steps_done hold_ms epoch next_base ended rung ready ready_v
-- End a unit. `device` ran it; `steps_done` (or '') goes with the ended event, which says `ended`
-- ('finished' or 'pruned') with `rung` (or ''); `hold_ms` > 0 says the device keeps the activations of the
-- unit's lane that long; `epoch` is its loop's, or '' when the caller does not go on with a held trial;
-- `next_base` the shared base layers the trial's next unit reads (policy.BaseShard's text, or ''). `ready` (the
-- lanes whose next unit can run, separated by spaces) and `remaining_units` are the engine's view after the
-- unit's commit, whose version is `ready_v`: the units of several lanes may complete in another order than
-- they committed, and the newest commit's view wins. Returns the trial's state, 'lost', or
-- {token, lease_ms, lane, expired} of the next unit of the same lane when the device goes on with it.
hold_ms = tonumber(hold_ms)
local ok, lane = release(id, token)
if ok == 'lost' then return 'lost' end
redis.call('HINCRBY', tkey(id), 'units_done', 1)
if tonumber(ready_v) >= tonumber(redis.call('HGET', tkey(id), 'ready_v') or '-1') then
  redis.call('HSET', tkey(id), 'ready', ready, 'ready_v', ready_v, 'remaining_units', remaining_units)
end
remaining_units = tonumber(redis.call('HGET', tkey(id), 'remaining_units'))
redis.call('HSET', tkey(id), 'unit_s', unit_s, 'last_device', device, 'next_base', next_base)
if hold_ms > 0 then
  redis.call('HSET', tkey(id), 'held_until', now_ms() + hold_ms, 'held_lane', lane)
  redis.call('SADD', key('held:' .. device), id)
elseif redis.call('HDEL', tkey(id), 'held_until') == 1 then
  redis.call('SREM', key('held:' .. device), id)
end
local flying, in_flight = lanes_in_flight(id)
if remaining_units == 0 and in_flight == 0 then
  redis.call('HDEL', tkey(id), 'control')
  set_state(id, ended, message, false, steps_done ~= '' and steps_done or nil, rung ~= '' and rung or nil)
  return ended
end
-- The device holds the lane and its loop `epoch` goes on: it runs the lane's next unit too (the policy's choice,
-- see policy.py), so lease it at once, unless that unit cannot run yet, a pause or cancel waits, or a trial
-- waits to be planned and no other device is planning (this one would leave training to plan).
if hold_ms > 0 and epoch ~= '' and not redis.call('HGET', tkey(id), 'control')
    and (plannable() == 0 or planning_elsewhere(device)) and not flying[lane]
    and string.find(' ' .. (redis.call('HGET', tkey(id), 'ready') or '') .. ' ', ' ' .. lane .. ' ', 1, true) then
  local loop = redis.call('HMGET', key('device:' .. device), 'epoch', 'stop')
  if loop[1] == epoch and loop[2] ~= '1' then
    local next_token, ms = grant_lease(id, device, lane)
    charge(id)
    widen_update(id)
    return {next_token, ms, lane, take_expired(id, lane)}
  end
end
if in_flight > 0 then  -- other lanes still run: the trial stays running
  widen_update(id)
  return 'running'
end
return after_unit(id, redis.call('HGET', tkey(id), 'active') == '1')
