-- args: id token expired remaining_units ready ready_v
-- Give back a claim that the device's policy did not confirm (speculative_claim.lua), or a unit whose lane could
-- not run after all: the lease ends, the team gets back the unit time it was charged (and, for a speculative
-- claim, its last service as it was), the lane's expired token (`expired`, what the lease carried, or '') goes
-- back on the trial, and the trial goes back as the end of a unit would put it: runnable (with the state event
-- it had, if the claim published one), or paused or cancelled when that was asked meanwhile; a trial whose other
-- lanes run stays running. A lane given back because it could not run brings the engine's view of the trial
-- (`ready`, `remaining_units` as of commit `ready_v`, as complete.lua takes them; '' from a speculative claim):
-- else the queue, behind (a store restored from its checkpoint is back at an earlier unit), would lease that
-- lane again and again. Returns its state, or 'lost'.
local ok, lane = release(id, token)
if ok == 'lost' then return 'lost' end
local t = redis.call('HMGET', tkey(id), 'team', 'unit_s', 'undo_device', 'undo_message', 'undo_active',
                     'undo_served')
local team = t[1] or ''
set_usage(team, math.max(0, usage_of(team) - tonumber(t[2] or '0')))
if t[6] and t[6] ~= '' then redis.call('HSET', key('served'), team, t[6])
elseif t[6] then redis.call('HDEL', key('served'), team) end
if expired ~= '' then note_expired(id, lane, expired) end
if ready_v ~= '' and tonumber(ready_v) >= tonumber(redis.call('HGET', tkey(id), 'ready_v') or '-1') then
  redis.call('HSET', tkey(id), 'ready', ready, 'ready_v', ready_v, 'remaining_units', remaining_units)
end
if t[3] then redis.call('HSET', tkey(id), 'device', t[3]) end
redis.call('HDEL', tkey(id), 'undo_device', 'undo_message', 'undo_active', 'undo_served')
local _, in_flight = lanes_in_flight(id)
if in_flight > 0 then
  widen_update(id)
  return redis.call('HGET', tkey(id), 'state')
end
return after_unit(id, t[5] == '1', t[4] and t[4] ~= '' and t[4] or nil)
