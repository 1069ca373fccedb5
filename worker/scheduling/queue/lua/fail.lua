-- args: id token message
-- Fail trial `id`, whose unit (or planning) under lease `token` raised, with `message`: 'failed', or 'lost'.
if release(id, token) == 'lost' then return 'lost' end
redis.call('HDEL', tkey(id), 'control')
set_state(id, 'failed', message)
return 'failed'
