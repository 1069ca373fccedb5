-- args: id token remaining_units unit_s plan units_done ready ready_v expired
-- End the planning lease of trial `id`: it takes its plan, first estimate and ready lanes and goes where the end
-- of a unit would put it. `units_done` > 0: its state already holds that many units (a resubmitted trial resumes
-- from it); `expired` ('<lane>=<token>' or ''): the lane whose last unit may have committed unreported (its next
-- lease reports it first). Returns its state, or 'lost'.
if release(id, token) == 'lost' then return 'lost' end
redis.call('HSET', tkey(id), 'remaining_units', remaining_units, 'unit_s', unit_s, 'plan', plan, 'ready', ready,
           'ready_v', ready_v)
if tonumber(units_done) > 0 then redis.call('HSET', tkey(id), 'units_done', units_done) end
if expired ~= '' then
  local lane, t = string.match(expired, '^([^=]+)=(.+)$')
  note_expired(id, lane, t)
end
return after_unit(id, false)
