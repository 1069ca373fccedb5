-- args: id token remaining_units unit_s device message steps_done hold_ms epoch next_base ended rung
-- End a unit. `device` ran it; `steps_done` (or '') goes with the ended event, which says `ended`
-- ('finished' or 'pruned') with `rung` (or ''); `hold_ms` > 0 says the device keeps the trial's activations
-- that long; `epoch` is its loop's, or '' when the caller does not go on with a held trial; `next_base` the
-- shared base layers the trial's next unit reads (policy.BaseShard's text, or ''). Returns the trial's state,
-- 'lost', or {token, lease_ms} of the next unit when the device goes on.
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
