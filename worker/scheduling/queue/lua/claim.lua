-- args: ids device
-- Lease the next unit of the first still runnable of `ids` (trial ids separated by spaces, in the caller's
-- order of preference): {id, token, lease_ms, units_done, job, export_dir, remaining_units, unit_s}, or false
-- when none is (other devices took them first).
return claim_first(ids, device)
