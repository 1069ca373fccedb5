-- args: id token
-- Give back a speculative claim (speculative_claim.lua) that the device's policy did not confirm: the lease
-- ends, the team gets back the unit time it was charged and its last service as it was, and the trial goes
-- back as the end of a unit would put it: runnable (with the state event it had, if the claim published one),
-- or paused or cancelled when that was asked meanwhile. Returns its state, or 'lost'.
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
