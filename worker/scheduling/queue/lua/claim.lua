-- args: ids device
-- Lease the next unit of the first still runnable (or still widening) of `ids` (trial ids separated by spaces,
-- in the caller's order of preference): see claim_first; false when none is (other devices took them first).
return claim_first(ids, device)
