-- args: id job export_dir team priority host_bytes paused
-- Add trial `id` in state planning; `paused` '1': once planned, it waits paused (a pause asked at once, as
-- control.lua would ask it). Returns 'ok', or 'exists'.
if redis.call('EXISTS', tkey(id)) == 1 then return 'exists' end
local now = now_ms() / 1000
redis.call('HSET', tkey(id), 'job', job, 'export_dir', export_dir, 'submitted', now, 'units_done', 0,
           'requeues', 0, 'team', team, 'priority', priority, 'host_bytes', host_bytes)
if paused == '1' then redis.call('HSET', tkey(id), 'control', 'pause') end
redis.call('ZADD', key('trials'), now, id)
planning_add(id, false)
set_state(id, 'planning')
wake()
return 'ok'
