-- args: id token remaining_units unit_s plan device message
-- A unit ran out of device memory and the trial was re-planned with smaller shards: the unit did not
-- complete (units_done stays), the trial takes the new plan and unit count and goes back to the runnable set,
-- with an event saying why. Returns its state, or 'lost'.
if release(id, token) == 'lost' then return 'lost' end
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan,
           'last_device', device)
redis.call('HDEL', tkey(id), 'held_until', 'next_base')
redis.call('HINCRBY', tkey(id), 'replans', 1)
return after_unit(id, false, message)
