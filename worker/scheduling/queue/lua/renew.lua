-- args: id token
-- Extend the lease `token` of trial `id` by the host's lease length: 1, or 0 when it was lost.
if redis.call('HEXISTS', lkey(id), token) == 0 then return 0 end
redis.call('ZADD', key('leases'), 'XX', now_ms() + lease_ms(), id .. ' ' .. token)
return 1
