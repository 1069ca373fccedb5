-- args: id token remaining_units unit_s plan units_done
-- End the planning lease of trial `id`: it takes its plan and first estimate and goes where the end of a
-- unit would put it. `units_done` > 0: its state already holds that many units (a resubmitted trial resumes
-- from it). Returns its state, or 'lost'.
if release(id, token) == 'lost' then return 'lost' end
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan)
if tonumber(units_done) > 0 then redis.call('HSET', tkey(id), 'units_done', units_done) end
return after_unit(id, false)
