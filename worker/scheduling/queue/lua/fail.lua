-- args: id token message
-- Fail trial `id`, whose unit (or planning) under lease `token` raised, with `message`: 'failed', or 'lost'.
-- Units of its other lanes still in flight are refused when they end.
if release(id, token) == 'lost' then return 'lost' end
release_all(id)
redis.call('HDEL', tkey(id), 'control')
set_state(id, 'failed', message)
return 'failed'
