-- args: id token remaining_units unit_s plan device message ready ready_v
-- A unit ran out of device memory and the trial was re-planned with smaller shards: the unit did not
-- complete (units_done stays), the trial takes the new plan, unit count and ready lanes and goes back to the
-- runnable set, with an event saying why. The units of other lanes still in flight ran under the old plan: their
-- leases end here (their commits are refused). Returns its state, or 'lost'.
if release(id, token) == 'lost' then return 'lost' end
release_all(id)
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan,
           'last_device', device, 'ready', ready, 'ready_v', ready_v)
redis.call('HDEL', tkey(id), 'held_until', 'next_base', 'expired')
redis.call('HINCRBY', tkey(id), 'replans', 1)
return after_unit(id, false, message)
