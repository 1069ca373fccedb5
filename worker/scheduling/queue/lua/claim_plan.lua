-- args: device idle
-- Take a trial waiting to be planned, with a lease (see claim_plan in the prelude).
return claim_plan(device, idle == '1')
